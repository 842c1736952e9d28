import pytest

from scaledl import Config
from scaledl.schedule import for_config, lr_at


def test_linear_scaling_and_warmup():
    kwargs = dict(lr=0.1, global_batch_size=512, base_batch_size=64, scale_lr=True, warmup_steps=10)
    assert lr_at(0, **kwargs) == pytest.approx(0.1)       # warm-up starts at the unscaled rate
    assert lr_at(5, **kwargs) == pytest.approx(0.1 + 0.7 * 0.5)
    assert lr_at(10, **kwargs) == pytest.approx(0.8)      # then k = 512/64 times the base rate
    assert lr_at(10, **{**kwargs, "scale_lr": False}) == pytest.approx(0.1)


def test_config_drives_the_schedule():
    schedule = for_config(Config(lr=0.05, batch_size=64, base_batch_size=64, warmup_epochs=1), world_size=4,
                          steps_per_epoch=20)
    assert schedule(0) == pytest.approx(0.05) and schedule(20) == pytest.approx(0.2)
    flat = for_config(Config(lr=0.05, warmup_epochs=0, scale_lr=False), world_size=4, steps_per_epoch=20)
    assert flat(0) == flat(100) == pytest.approx(0.05)
