"""telemetry.NoiseWatch: one warning when step times stop describing the load."""

import random

from sglang_dspark.telemetry import NoiseWatch


def test_steady_steps_never_warn():
    w, rng = NoiseWatch(), random.Random(0)
    for _ in range(2000):
        assert w.observe(num_requests=4, verify_tokens=12, step_s=0.010 * (1 + 0.2 * rng.random())) is None
    assert w.check_error(predicted_steps=2000, median_rel_error=0.08) is None
    assert w.warned == {}


def test_bimodal_step_times_warn_once_naming_the_shape_and_the_cores():
    w, msgs = NoiseWatch(), []
    for i in range(200):   # every 4th step is stolen by a neighbour: 10 ms vs 400 ms
        m = w.observe(num_requests=16, verify_tokens=40, step_s=0.40 if i % 4 == 0 else 0.010)
        msgs.append(m)
    fired = [m for m in msgs if m]
    assert len(fired) == 1 and "bimodal" in fired[0] and "16 requests and 40 verify tokens" in fired[0]
    assert "OpenMP" in fired[0] and set(w.warned) == {"bimodal"}


def test_shapes_are_compared_only_with_themselves():
    w = NoiseWatch()
    for i in range(400):   # two loads, each steady: one is 20x the other
        r = 1 if i % 2 else 32
        assert w.observe(num_requests=r, verify_tokens=4 * r, step_s=0.005 * r) is None


def test_unexplained_error_warns_after_enough_steps_only():
    w = NoiseWatch(min_steps=512, max_error=0.5)
    assert w.check_error(predicted_steps=100, median_rel_error=3.0) is None
    msg = w.check_error(predicted_steps=600, median_rel_error=5.64)
    assert msg and "564%" in msg and "600 steps" in msg
    assert w.check_error(predicted_steps=700, median_rel_error=5.64) is None   # once
