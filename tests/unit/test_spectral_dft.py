"""The truncated-DFT spectral path: equal to the FFT path to float32 rounding, forward and backward.

Compilation of the DFT path is covered by tests/integration/test_trainer_engine.py (configs/tiny.yaml keeps
8 of 64 modes, so `auto` takes the DFT path there), ONNX export by benchmarks/onnx_export_fno.py.
"""

from __future__ import annotations

import pytest
import torch

from dynaforge.config import ConfigError, FNOConfig, load_config
from dynaforge.models import ModelInput, ModelShape, build_model
from dynaforge.models.dft import fft_matrices, irfft_matrix, rfft_matrix
from dynaforge.models.spectral import SpectralConv

CPU = torch.device("cpu")


@pytest.mark.parametrize(("n", "m"), [(16, 6), (16, 9), (17, 9), (21, 11), (8, 5)])
def test_rfft_matrix_equals_rfft(n: int, m: int) -> None:
    """Including the Nyquist mode (n even, m = n / 2 + 1) and odd grids."""
    x = torch.randn(3, n, dtype=torch.float64)
    spectrum = torch.fft.rfft(x)[..., :m]
    product = x @ rfft_matrix(n, m, CPU).double()
    torch.testing.assert_close(product, torch.cat([spectrum.real, spectrum.imag], dim=-1), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("n", "m"), [(16, 6), (16, 9), (17, 9), (21, 11), (8, 5)])
def test_irfft_matrix_equals_irfft_of_a_truncated_spectrum(n: int, m: int) -> None:
    """Any imaginary part on the zero and Nyquist modes is ignored, as irfft ignores it."""
    spectrum = torch.randn(3, m, dtype=torch.complex128)
    padded = torch.cat([spectrum, torch.zeros(3, n // 2 + 1 - m, dtype=torch.complex128)], dim=-1)
    expected = torch.fft.irfft(padded, n=n)
    parts = torch.cat([spectrum.real, spectrum.imag], dim=-1)
    torch.testing.assert_close(parts @ irfft_matrix(n, m, CPU).double(), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("n", "m"), [(10, 3), (11, 5), (8, 4)])
def test_fft_matrices_give_the_kept_modes_of_a_full_fft(n: int, m: int) -> None:
    x = torch.randn(2, n, dtype=torch.complex128)
    cos, sin = (t.double() for t in fft_matrices(n, m, CPU))
    kept = torch.fft.fft(x)[..., list(range(m)) + list(range(n - m, n))]
    real = x.real @ cos + x.imag @ sin
    imag = x.imag @ cos - x.real @ sin
    torch.testing.assert_close(torch.complex(real, imag), kept, atol=1e-6, rtol=0)


def layer_pair(
    in_channels: int, out_channels: int, modes: tuple[int, ...]
) -> tuple[SpectralConv, SpectralConv]:
    fft = SpectralConv(in_channels, out_channels, modes, transform="fft")
    dft = SpectralConv(in_channels, out_channels, modes, transform="dft")
    dft.load_state_dict(fft.state_dict())
    return fft, dft


CASES = [
    ((2, 3, 16), (6,)),
    ((2, 3, 16), (9,)),  # every rfft mode, the Nyquist one included
    ((2, 3, 17), (9,)),
    ((2, 3, 21), (6,)),
    ((2, 2, 10, 9), (3, 4)),
    ((2, 2, 11, 8), (5, 5)),  # Nyquist on the last axis, odd first axis
    ((2, 2, 10, 8), (5, 5)),  # every mode on both axes
    ((1, 2, 6, 5, 8), (2, 2, 5)),
]


@pytest.mark.parametrize(("shape", "modes"), CASES)
def test_dft_path_equals_fft_path_forward_and_backward(
    shape: tuple[int, ...], modes: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    fft, dft = layer_pair(shape[1], 4, modes)
    x = torch.randn(*shape, dtype=torch.float32)
    grad_out = torch.randn(shape[0], 4, *shape[2:], dtype=torch.float32)
    results = []
    for layer in (fft, dft):
        x_in = x.clone().requires_grad_(True)
        output = layer(x_in)
        output.backward(grad_out)
        results.append((output, x_in.grad, layer.weight_real.grad, layer.weight_imag.grad))
    for reference, value in zip(*results):
        scale = reference.abs().max().item()
        torch.testing.assert_close(value, reference, atol=1e-6 * scale, rtol=1e-5)


def test_channels_last_entry_equals_the_channels_first_one() -> None:
    torch.manual_seed(1)
    for transform in ("fft", "dft"):
        layer = SpectralConv(3, 2, (4, 3), transform=transform)
        x = torch.randn(2, 3, 9, 8, dtype=torch.float32)
        torch.testing.assert_close(
            layer.forward_channels_last(x.movedim(1, -1)), layer(x).movedim(1, -1), atol=1e-7, rtol=1e-6
        )


def test_auto_uses_the_dft_matrices_only_for_few_modes() -> None:
    layer = SpectralConv(2, 2, (16,), transform="auto")
    assert layer.chosen_transform((128,)) == "dft"
    assert layer.chosen_transform((64,)) == "dft"
    assert layer.chosen_transform((32,)) == "fft"
    layer_2d = SpectralConv(2, 2, (8, 8), transform="auto")
    assert layer_2d.chosen_transform((64, 64)) == "dft"
    assert layer_2d.chosen_transform((64, 16)) == "fft"


def test_dft_path_checks_the_grid_size() -> None:
    layer = SpectralConv(1, 1, (9,), transform="dft")
    with pytest.raises(ValueError, match=r"lower model\.modes"):
        layer(torch.randn(1, 1, 12, dtype=torch.float32))


def fno_pair(spatial_dims: int, **extra: object) -> tuple[torch.nn.Module, torch.nn.Module]:
    shape = ModelShape(channels=1, history=2, horizon=1, spatial_dims=spatial_dims)
    torch.manual_seed(3)
    fft = build_model(FNOConfig(width=8, modes=4, layers=2, projection=16, spectral_transform="fft"), shape)
    dft = build_model(
        FNOConfig(width=8, modes=4, layers=2, projection=16, spectral_transform="dft", **extra), shape
    )
    dft.load_state_dict(fft.state_dict())
    return fft, dft


@pytest.mark.parametrize("spatial_dims", [1, 2])
def test_fno_gives_the_same_output_with_either_transform(spatial_dims: int) -> None:
    fft, dft = fno_pair(spatial_dims)
    frames = torch.randn(3, 2, 1, *(12,) * spatial_dims, dtype=torch.float32)
    reference = fft(ModelInput(frames=frames)).frames
    torch.testing.assert_close(dft(ModelInput(frames=frames)).frames, reference, atol=1e-6, rtol=1e-5)


def test_fno_keeps_the_parameter_layout_of_its_convolutions() -> None:
    """Checkpoints written before the channels-last layout load unchanged: same names and shapes."""
    model = build_model(FNOConfig(width=8, modes=4, layers=2, projection=16), ModelShape(1, 2, 1))
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes["lift.weight"] == (8, 2, 1)
    assert shapes["blocks.0.pointwise.weight"] == (8, 8, 1)
    assert shapes["project.0.weight"] == (16, 8, 1) and shapes["project.2.bias"] == (1,)
    assert shapes["blocks.1.spectral.weight_real"] == (8, 8, 4)


def test_bf16_autocast_keeps_the_spectral_path_in_fp32_unless_asked() -> None:
    torch.manual_seed(4)
    fp32_layer, bf16_layer = layer_pair(8, 8, (6,))
    bf16_layer.low_precision = True
    fp32_layer.transform = "dft"
    x = torch.randn(4, 8, 64, dtype=torch.float32)
    reference = fp32_layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kept_fp32 = fp32_layer(x)
        low = bf16_layer(x)
    assert kept_fp32.dtype == torch.float32
    torch.testing.assert_close(kept_fp32, reference, atol=1e-7, rtol=1e-6)
    relative = ((low.float() - reference).norm() / reference.norm()).item()
    assert 1e-4 < relative < 3e-2  # bf16 has an 8-bit mantissa: visibly rounded, still close


def test_spectral_transform_is_a_config_choice() -> None:
    config = load_config(None, ["model.spectral_transform=dft"])
    assert isinstance(config.model, FNOConfig) and config.model.spectral_transform == "dft"
    assert FNOConfig().spectral_transform == "auto" and not FNOConfig().spectral_low_precision
    with pytest.raises(ConfigError, match="spectral_transform"):
        load_config(None, ["model.spectral_transform=matrix"])
