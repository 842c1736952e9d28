"""Lesson 9's per-layer sequence of a sharded step: what each reshard setting gathers, and when."""
import pytest

from scaledl.workshop import fsdp_timeline


@pytest.mark.parametrize("layers", [1, 3, 5])
def test_resharding_after_forward_gathers_twice_and_holds_one_layer(layers):
    steps = fsdp_timeline.events(layers, reshard_after_forward=True)
    assert sum(e.lane == "all-gather" for e in steps) == 2 * layers
    assert sum(e.lane == "reduce-scatter" for e in steps) == layers
    assert max(e.whole_after for e in steps) == 1 and steps[-1].whole_after == 0


@pytest.mark.parametrize("layers", [1, 3, 5])
def test_keeping_layers_gathered_gathers_once_and_holds_them_all(layers):
    steps = fsdp_timeline.events(layers, reshard_after_forward=False)
    assert sum(e.lane == "all-gather" for e in steps) == layers
    assert max(e.whole_after for e in steps) == layers and steps[-1].whole_after == 0


def test_a_layer_is_freed_before_its_gradients_are_reduce_scattered():
    steps = fsdp_timeline.events(3, reshard_after_forward=False)
    backward = [e for e in steps if e.label == "B 3"][0]
    scatter = steps[steps.index(backward) + 1]
    assert scatter.label == "RS 3" and backward.whole_after == 2  # layer 3 freed, 2 and 1 still whole


def test_no_layers_is_a_clear_error():
    with pytest.raises(ValueError, match="at least 1"):
        fsdp_timeline.events(0, True)
