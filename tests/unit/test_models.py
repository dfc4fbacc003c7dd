"""Models: shapes, dtypes, gradients, odd sizes, the real-arithmetic spectral convolution, the registry."""

import pytest
import torch

from dynaforge.config import ConfigError, FNOConfig, UNetConfig, config_to_dict, load_config
from dynaforge.models import (
    MODELS,
    ModelInput,
    ModelShape,
    SpectralConv,
    autoregressive_rollout,
    build_model,
    model_from_checkpoint,
)

CONFIGS = {
    "fno": FNOConfig(width=8, modes=5, layers=2, projection=16),
    "unet": UNetConfig(channels=8, levels=3),
}


def make(name: str, shape: ModelShape, residual: bool = True) -> torch.nn.Module:
    config = CONFIGS[name]
    config = type(config)(**{**config_to_dict(config), "residual": residual})
    torch.manual_seed(0)
    return build_model(config, shape)


def test_registry_covers_every_model_config() -> None:
    assert set(MODELS) == {"fno", "unet", "latent", "flow"}
    with pytest.raises(TypeError, match="FNOConfig"):
        build_model(UNetConfig(name="fno"), ModelShape(1, 1, 1))


@pytest.mark.parametrize("name", ["fno", "unet"])
@pytest.mark.parametrize("size", [16, 33, 37])
def test_output_shape_and_gradients(name: str, size: int) -> None:
    shape = ModelShape(channels=2, history=3, horizon=2)
    model = make(name, shape, residual=False)
    frames = torch.randn(4, 3, 2, size, dtype=torch.float32, requires_grad=True)
    output = model(ModelInput(frames=frames)).frames
    assert output.shape == (4, 2, 2, size) and output.dtype == torch.float32
    output.square().mean().backward()
    assert frames.grad is not None and torch.isfinite(frames.grad).all() and frames.grad.abs().sum() > 0
    for parameter_name, parameter in model.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), parameter_name
    assert sum(p.grad.abs().sum() for p in model.parameters()) > 0


@pytest.mark.parametrize("name", ["fno", "unet"])
def test_bfloat16_forward_and_backward(name: str) -> None:
    shape = ModelShape(channels=1, history=2, horizon=1)
    model = make(name, shape, residual=False)
    frames = torch.randn(3, 2, 1, 24, dtype=torch.float32)
    reference = model(ModelInput(frames=frames)).frames
    low = model.to(torch.bfloat16)
    output = low(ModelInput(frames=frames.to(torch.bfloat16))).frames
    assert output.dtype == torch.bfloat16 and torch.isfinite(output).all()
    torch.testing.assert_close(output.float(), reference, atol=0.1, rtol=0.05)
    output.float().square().mean().backward()
    assert all(torch.isfinite(p.grad.float()).all() for p in low.parameters())


@pytest.mark.parametrize("name", ["fno", "unet"])
def test_residual_model_starts_as_persistence(name: str) -> None:
    model = make(name, ModelShape(channels=2, history=2, horizon=3))
    frames = torch.randn(2, 2, 2, 20, dtype=torch.float32)
    output = model(ModelInput(frames=frames)).frames
    torch.testing.assert_close(output, frames[:, -1:].expand(-1, 3, -1, -1))


@pytest.mark.parametrize("name", ["fno", "unet"])
def test_output_layer_is_the_layer_a_residual_model_zeroes(name: str) -> None:
    """`GridModel.output_layer` (what the refiner zeroes too) is the layer that writes the update: all zero
    in a residual model, random without `residual`."""
    shape = ModelShape(channels=2, history=2, horizon=1)
    zeroed, random = make(name, shape).output_layer(), make(name, shape, residual=False).output_layer()
    assert zeroed is not None and random is not None
    assert all(torch.count_nonzero(p) == 0 for p in zeroed.parameters())
    assert torch.count_nonzero(next(random.parameters())) > 0
    assert set(dict(random.named_parameters())) == set(dict(zeroed.named_parameters()))


def test_fno_commutes_with_periodic_shifts() -> None:
    model = make("fno", ModelShape(channels=1, history=1, horizon=1), residual=False)
    frames = torch.randn(2, 1, 1, 32, dtype=torch.float32)
    shifted = model(ModelInput(frames=torch.roll(frames, 5, dims=-1))).frames
    torch.testing.assert_close(shifted, torch.roll(model(ModelInput(frames=frames)).frames, 5, dims=-1))


@pytest.mark.parametrize("spatial", [(32,), (12, 10)])
def test_fno_with_coordinates_reads_where_it_is(spatial: tuple[int, ...]) -> None:
    config = FNOConfig(width=8, modes=4, layers=2, projection=16, residual=False, coordinates=True)
    torch.manual_seed(0)
    model = build_model(config, ModelShape(channels=1, history=1, horizon=1, spatial_dims=len(spatial)))
    assert model.lift.weight.shape[1] == 1 + len(spatial)  # the field and one coordinate per axis
    frames = torch.randn(2, 1, 1, *spatial, dtype=torch.float32, requires_grad=True)
    output = model(ModelInput(frames=frames)).frames
    output.sum().backward()
    assert output.shape == frames.shape and torch.isfinite(frames.grad).all()
    # Unlike the plain FNO (test above), a shifted input no longer gives the shifted output.
    shifted = model(ModelInput(frames=torch.roll(frames, 5, dims=-1))).frames
    assert not torch.allclose(shifted, torch.roll(output, 5, dims=-1), atol=1e-4)


def test_wrong_input_shapes_name_the_fix() -> None:
    model = make("fno", ModelShape(channels=1, history=2, horizon=1))
    with pytest.raises(ValueError, match=r"history=2.*frames\[None\]"):
        model(ModelInput(frames=torch.randn(2, 1, 32, dtype=torch.float32)))
    with pytest.raises(ValueError, match=r"lower model\.modes"):
        model(ModelInput(frames=torch.randn(1, 2, 1, 6, dtype=torch.float32)))
    unet = make("unet", ModelShape(channels=1, history=1, horizon=1))
    with pytest.raises(ValueError, match=r"lower model\.levels"):
        unet(ModelInput(frames=torch.randn(1, 1, 1, 3, dtype=torch.float32)))


def complex_reference(layer: SpectralConv, x: torch.Tensor) -> torch.Tensor:
    """The same layer written with complex tensors, mode block by mode block (the textbook FNO layer)."""
    weight = torch.complex(layer.weight_real, layer.weight_imag).to(torch.complex128)
    spectrum = torch.fft.rfftn(x.double(), dim=tuple(range(-layer.spatial_dims, 0)))
    out = torch.zeros(x.shape[0], layer.out_channels, *spectrum.shape[2:], dtype=torch.complex128)
    if layer.spatial_dims == 1:
        m = layer.modes[0]
        out[..., :m] = torch.einsum("bix,iox->box", spectrum[..., :m], weight)
        return torch.fft.irfft(out, n=x.shape[-1])
    m1, m2 = layer.modes
    out[..., :m1, :m2] = torch.einsum("bixy,ioxy->boxy", spectrum[..., :m1, :m2], weight[..., :m1, :])
    out[..., -m1:, :m2] = torch.einsum("bixy,ioxy->boxy", spectrum[..., -m1:, :m2], weight[..., m1:, :])
    return torch.fft.irfft2(out, s=x.shape[-2:])


@pytest.mark.parametrize("size", [16, 21])
def test_real_spectral_conv_equals_complex_reference_1d(size: int) -> None:
    torch.manual_seed(1)
    layer = SpectralConv(3, 4, modes=(6,))
    x = torch.randn(2, 3, size, dtype=torch.float32)
    torch.testing.assert_close(layer(x).double(), complex_reference(layer, x), atol=1e-5, rtol=1e-4)


def test_real_spectral_conv_equals_complex_reference_2d() -> None:
    torch.manual_seed(2)
    layer = SpectralConv(2, 3, modes=(3, 4))
    x = torch.randn(2, 2, 10, 9, dtype=torch.float32)
    output = layer(x)
    assert output.shape == (2, 3, 10, 9)
    torch.testing.assert_close(output.double(), complex_reference(layer, x), atol=1e-5, rtol=1e-4)


def test_spectral_init_normal_is_glorot_sized_and_small_is_li_sized() -> None:
    torch.manual_seed(3)
    normal = SpectralConv(32, 32, modes=(16,), init="normal")
    small = SpectralConv(32, 32, modes=(16,))
    magnitude = torch.complex(normal.weight_real, normal.weight_imag).abs().pow(2).mean().sqrt()
    # |w| has standard deviation sqrt(2 / (in + out)) = 0.177 here; 16,384 draws put the estimate within 2 %.
    assert abs(magnitude.item() - (2 / 64) ** 0.5) < 0.02 * (2 / 64) ** 0.5
    assert normal.weight_real.min() < 0 < normal.weight_imag.max()
    # Li et al.'s: uniform in [0, 1 / (in * out)).
    assert small.weight_real.min() >= 0 and small.weight_real.max() < 1 / 32**2
    config = FNOConfig(width=8, modes=4, layers=2, projection=16, spectral_init="normal")
    block = build_model(config, ModelShape(1, 1, 1)).blocks[0].spectral
    assert block.weight_real.abs().max() > 1 / 8**2
    with pytest.raises(ValueError, match="spectral_init"):
        load_config(None, ["model.spectral_init=large"])


def test_spectral_conv_holds_only_real_parameters() -> None:
    layer = SpectralConv(2, 2, modes=(4,))
    assert all(not p.is_complex() for p in layer.parameters())


def test_fno_in_two_dimensions() -> None:
    model = make("fno", ModelShape(channels=2, history=1, horizon=1, spatial_dims=2), residual=False)
    frames = torch.randn(2, 1, 2, 12, 11, dtype=torch.float32, requires_grad=True)
    output = model(ModelInput(frames=frames)).frames
    assert output.shape == (2, 1, 2, 12, 11)
    output.sum().backward()
    assert torch.isfinite(frames.grad).all()


def test_rollout_feeds_predictions_back_and_returns_only_predictions() -> None:
    class AddOne(torch.nn.Module):
        def forward(self, inputs: ModelInput):  # the next frame: the last plus one
            from dynaforge.models import ModelOutput

            return ModelOutput(frames=inputs.frames[:, -1:] + 1)

    frames = torch.zeros(1, 2, 1, 4, dtype=torch.float32)
    predicted = autoregressive_rollout(AddOne(), ModelInput(frames=frames), steps=3)
    assert predicted.shape == (1, 3, 1, 4)
    torch.testing.assert_close(predicted[0, :, 0, 0], torch.tensor([1.0, 2.0, 3.0]))


def test_model_rebuilt_from_checkpoint_data_gives_the_same_outputs() -> None:
    config = load_config(None, ["model.width=8", "model.modes=4", "model.layers=2", "model.residual=false"])
    shape = ModelShape(channels=1, history=2, horizon=1)
    torch.manual_seed(3)
    model = build_model(config.model, shape)
    checkpoint = {
        "config": config_to_dict(config),
        "model_shape": shape._asdict(),
        "model": model.state_dict(),
    }
    torch.manual_seed(4)
    rebuilt = model_from_checkpoint(checkpoint)
    frames = torch.randn(2, 2, 1, 16, dtype=torch.float32)
    torch.testing.assert_close(rebuilt(ModelInput(frames)).frames, model(ModelInput(frames)).frames)


@pytest.mark.parametrize("name", ["fno", "unet"])
@pytest.mark.parametrize("size", [(16, 16), (17, 12)])
def test_two_dimensional_output_shape_and_gradients(name: str, size: tuple[int, int]) -> None:
    shape = ModelShape(channels=2, history=2, horizon=1, spatial_dims=2)
    model = make(name, shape, residual=False)
    frames = torch.randn(3, 2, 2, *size, dtype=torch.float32, requires_grad=True)
    output = model(ModelInput(frames=frames)).frames
    assert output.shape == (3, 1, 2, *size) and output.dtype == torch.float32
    output.square().mean().backward()
    assert frames.grad is not None and frames.grad.abs().sum() > 0
    for parameter_name, parameter in model.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), parameter_name


def test_unet_2d_uses_2d_convolutions_and_starts_as_persistence() -> None:
    model = make("unet", ModelShape(channels=3, history=2, horizon=2, spatial_dims=2))
    assert all(m.weight.ndim == 4 for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    assert not any(isinstance(m, torch.nn.Conv1d) for m in model.modules())
    frames = torch.randn(2, 2, 3, 12, 20, dtype=torch.float32)
    output = model(ModelInput(frames=frames)).frames
    torch.testing.assert_close(output, frames[:, -1:].expand(-1, 2, -1, -1, -1))


def test_unet_2d_mixes_both_axes_periodically() -> None:
    """A point impulse reaches both axes, and wraps around the periodic edges (circular padding)."""
    model = make("unet", ModelShape(channels=1, history=1, horizon=1, spatial_dims=2), residual=False).eval()
    base = torch.zeros(1, 1, 1, 16, 16, dtype=torch.float32)
    impulse = base.clone()
    impulse[..., 0, 0] = 1.0
    with torch.inference_mode():
        change = (model(ModelInput(impulse)).frames - model(ModelInput(base)).frames).abs()[0, 0, 0]
    assert change[1, 0] > 0 and change[0, 1] > 0  # both axes
    assert change[-1, 0] > 0 and change[0, -1] > 0  # across the periodic edges


def test_unet_2d_rejects_grids_too_small_for_its_levels() -> None:
    unet = make("unet", ModelShape(channels=1, history=1, horizon=1, spatial_dims=2))
    with pytest.raises(ValueError, match=r"per axis.*lower model\.levels"):
        unet(ModelInput(frames=torch.randn(1, 1, 1, 16, 3, dtype=torch.float32)))


def test_unet_1d_parameter_names_are_unchanged() -> None:
    """1D checkpoints written before the U-Net learned 2D keep loading: same names and shapes."""
    state = make("unet", ModelShape(channels=1, history=2, horizon=1)).state_dict()
    level = [f"layers.{i}.{p}" for i in (0, 1, 3, 4) for p in ("weight", "bias")]
    expected = {
        f"{part}.{i}.{name}"
        for part, n in (("encoders", 3), ("decoders", 2))
        for i in range(n)
        for name in level
    }
    assert set(state) == expected | {"output.weight", "output.bias"}
    assert state["encoders.0.layers.0.weight"].shape == (8, 2, 3)
    assert state["decoders.0.layers.0.weight"].shape == (16, 48, 3)


@pytest.mark.parametrize("spatial", [(32,), (16, 12)])
def test_fno_domain_padding_drops_the_periodic_assumption(spatial: tuple[int, ...]) -> None:
    """With `domain_padding` the FNO sees zeros beyond the far wall instead of the other wall: a circularly
    shifted input no longer gives the shifted output (it does without: test_fno_commutes_with_periodic_shifts);
    the output keeps the input's grid, and gradients flow."""
    config = FNOConfig(width=8, modes=4, layers=2, projection=16, residual=False, domain_padding=0.25)
    torch.manual_seed(0)
    model = build_model(config, ModelShape(channels=1, history=1, horizon=1, spatial_dims=len(spatial)))
    frames = torch.randn(2, 1, 1, *spatial, dtype=torch.float32, requires_grad=True)
    output = model(ModelInput(frames=frames)).frames
    output.sum().backward()
    assert output.shape == frames.shape and torch.isfinite(frames.grad).all()
    shifted = model(ModelInput(frames=torch.roll(frames, 4, dims=-1))).frames
    assert not torch.allclose(shifted, torch.roll(output, 4, dims=-1), atol=1e-4)
    with pytest.raises(ConfigError, match="domain_padding"):
        FNOConfig(domain_padding=1.5)


@pytest.mark.parametrize("padding", ["circular", "zeros", "replicate"])
def test_unet_padding_decides_whether_the_grid_has_edges(padding: str) -> None:
    """A uniform field: with circular padding every convolution sees no edge, so the output is uniform too;
    zero padding (walls) makes the points next to the edges differ; replicate padding keeps a uniform field
    uniform, as circular does."""
    config = UNetConfig(channels=8, levels=3, residual=False, padding=padding)
    torch.manual_seed(0)
    model = build_model(config, ModelShape(channels=1, history=1, horizon=1)).eval()
    with torch.inference_mode():
        output = model(ModelInput(frames=torch.full((1, 1, 1, 32), 0.7))).frames[0, 0, 0]
    uniform = bool((output - output[16]).abs().max() < 1e-5)
    assert uniform == (padding != "zeros"), (output - output[16]).abs().max()


@pytest.mark.parametrize("padding", [0.0, 0.25])
def test_the_fno_traces_for_the_legacy_onnx_exporter(padding: float) -> None:
    """TorchScript's tracer (torch.onnx.export with dynamo=False, the exporter some users still call) gives
    tensor sizes as tensors, which round() refuses: the FNO, with and without `domain_padding`, must turn them
    into ints first (round() of a traced size raised TypeError once domain padding was added;
    benchmarks/onnx_export_fno.py found it)."""
    pytest.importorskip("onnx")
    import io
    import warnings

    import jaxtyping

    config = FNOConfig(width=8, modes=4, layers=2, projection=16, residual=False, domain_padding=padding)
    model = build_model(config, ModelShape(channels=1, history=1, horizon=1)).eval()

    class Network(torch.nn.Module):  # the stacked-frames map the exporters see
        def __init__(self) -> None:
            super().__init__()
            self.fno = model

        def forward(self, stacked: torch.Tensor) -> torch.Tensor:
            return self.fno.network(stacked)

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The suite's runtime shape checks cannot read traced sizes; the exporter runs without them.
        before = jaxtyping.config.jaxtyping_disable
        jaxtyping.config.update("jaxtyping_disable", True)
        try:
            torch.onnx.export(Network(), (torch.randn(2, 1, 32),), buffer, dynamo=False)
        finally:
            jaxtyping.config.update("jaxtyping_disable", before)
    assert buffer.getbuffer().nbytes > 0
