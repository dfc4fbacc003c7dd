"""The latent operator and the flow network: shapes in 1D and 2D, conditioning, U-shaped token merging,
gradients, identity at initialisation, and rebuilding from a checkpoint's config."""

import pytest
import torch

from dynaforge.config import FlowNetConfig, LatentConfig, config_to_dict
from dynaforge.models import ModelInput, ModelShape, build_model
from dynaforge.models.flow import FlowInput
from dynaforge.models.latent import Conditions, merge_tokens, split_tokens


def latent(dims: int, **overrides: object) -> torch.nn.Module:
    fields = {"width": 16, "stem": 8, "patch": 2, "depth": 2, "heads": 2, "parameters": 3, **overrides}
    torch.manual_seed(0)
    return build_model(
        LatentConfig(**fields), ModelShape(channels=2, history=2, horizon=1, spatial_dims=dims)
    )


@pytest.mark.parametrize("dims,space", [(1, (32,)), (2, (8, 12))])
@pytest.mark.parametrize("attention", ["standard", "channel", "alternate"])
@pytest.mark.parametrize("merge_levels", [0, 1])
def test_latent_shapes_and_gradients(
    dims: int, space: tuple[int, ...], attention: str, merge_levels: int, one_thread: None
) -> None:
    model = latent(dims, attention=attention, merge_levels=merge_levels, residual=False)
    frames = torch.randn(3, 2, 2, *space, dtype=torch.float32, requires_grad=True)
    conditions = Conditions(dt=torch.full((3,), 0.5, dtype=torch.float32), params=torch.randn(3, 3))
    output = model(ModelInput(frames=frames), conditions).frames
    assert output.shape == (3, 1, 2, *space) and output.dtype == torch.float32
    output.square().mean().backward()
    assert frames.grad is not None and torch.isfinite(frames.grad).all() and frames.grad.abs().sum() > 0


def test_residual_latent_starts_as_identity_and_conditions_matter(one_thread: None) -> None:
    model = latent(1, residual=True)
    frames = torch.randn(2, 2, 2, 16, dtype=torch.float32)
    assert torch.equal(model(ModelInput(frames=frames)).frames, frames[:, -1:])
    for parameter in model.parameters():  # move every weight off its start
        parameter.data.add_(0.05 * torch.randn_like(parameter))
    a = Conditions(dt=torch.full((2,), 0.1, dtype=torch.float32), params=torch.zeros(2, 3))
    b = Conditions(dt=torch.full((2,), 0.4, dtype=torch.float32), params=torch.ones(2, 3))
    assert not torch.allclose(
        model(ModelInput(frames=frames), a).frames, model(ModelInput(frames=frames), b).frames
    )


def test_latent_rejects_grid_not_multiple_of_patch() -> None:
    model = latent(1, merge_levels=1)
    with pytest.raises(ValueError, match="multiple of patch"):
        model(ModelInput(frames=torch.randn(1, 2, 2, 18, dtype=torch.float32)))


@pytest.mark.parametrize("grid", [(8,), (4, 6)])
def test_split_tokens_inverts_merge_tokens(grid: tuple[int, ...]) -> None:
    x = torch.randn(2, int(torch.tensor(grid).prod()), 5, dtype=torch.float32)
    merged = merge_tokens(x, grid)
    assert merged.shape == (2, x.shape[1] // 2 ** len(grid), 5 * 2 ** len(grid))
    assert torch.equal(split_tokens(merged, grid), x)


def test_merge_tokens_groups_2d_neighbours() -> None:
    grid = (4, 4)
    index = torch.arange(16, dtype=torch.float32).reshape(1, 16, 1)  # token (i, j) holds 4 i + j
    merged = merge_tokens(index, grid)
    assert merged[0, 0].tolist() == [0.0, 1.0, 4.0, 5.0]  # the top-left 2 x 2 block


@pytest.mark.parametrize("dims,space", [(1, (20,)), (2, (6, 10))])
def test_flow_net_shapes(dims: int, space: tuple[int, ...], one_thread: None) -> None:
    torch.manual_seed(0)
    model = build_model(FlowNetConfig(width=8, layers=2, parameters=1), ModelShape(2, 1, 1, dims))
    state = torch.randn(3, 2, *space, dtype=torch.float32, requires_grad=True)
    inputs = FlowInput(
        state=state,
        time=torch.rand(3, dtype=torch.float32),
        condition=torch.randn(3, 2, 2, *space, dtype=torch.float32),
        params=torch.randn(3, 1, dtype=torch.float32),
    )
    velocity = model(inputs).velocity
    assert velocity.shape == state.shape
    velocity.sum().backward()
    assert state.grad is not None and torch.isfinite(state.grad).all()
    with pytest.raises(ValueError, match="condition"):
        model(inputs._replace(condition=torch.randn(3, 1, 2, *space, dtype=torch.float32)))


def test_latent_config_validation_names_the_fix() -> None:
    from dynaforge.config import ConfigError

    with pytest.raises(ConfigError, match="heads"):
        LatentConfig(width=10, heads=3)
    with pytest.raises(ConfigError, match="depth"):
        LatentConfig(depth=2, merge_levels=2)
    assert config_to_dict(LatentConfig())["name"] == "latent"
