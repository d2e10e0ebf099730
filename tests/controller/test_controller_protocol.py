"""Wire protocol framing/limits/fuzzing and the profile file schema."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

from dsc_helpers import fingerprint
from dspark_controller.core.profile_file import (
    ErrorMetrics, ProfileFile, SpsModelState, export_json_schema, load_profile, make_provenance, save_profile,
)
from dspark_controller.service.protocol import (
    PROTOCOL_VERSION, BudgetDecision, DecodeError, Heartbeat, PolicySpec, ProfileUpdate, Register,
    StatusRequest, StepTelemetry, TelemetryBatch, decode_frames, encode, encode_pub,
)
from dspark_controller.sim.synthetic import CURVES, synth_step
from dspark_controller.core.sps_model import SpsModel


def step(seq=0, **kw):
    base = dict(seq=seq, num_running_requests=4, verify_tokens=20, step_time_s=0.012,
                accepted_lens=[1, 2, 3, 0], verify_lens=[4, 4, 4, 4])
    base.update(kw)
    return StepTelemetry(**base)


def sample_messages():
    fp = fingerprint()
    return [
        Register(engine_id="e0", worker_id="w0", client_nonce="n0", fingerprint=fp),
        Heartbeat(engine_id="e0", client_nonce="n0", seq=3),
        TelemetryBatch(engine_id="e0", client_nonce="n0", steps=[step(0), step(1)]),
        BudgetDecision(engine_id="e0", profile_key=fp.profile_key(), policy=PolicySpec(), seq=1, issued_at=1.0,
                       valid_for_s=5.0, num_requests=4, budget_tokens=6),
        StatusRequest(),
    ]


def test_roundtrip_every_message():
    for msg in sample_messages():
        frames = encode(msg)
        assert frames[0] == msg.type.encode()
        assert decode_frames(frames) == msg
        assert json.loads(frames[1])["version"] == PROTOCOL_VERSION


def test_pub_topics_are_exact():
    d = sample_messages()[3]
    topic, body = encode_pub(d)
    assert topic == b"D|e0|" and not topic.startswith(b"D|e|")
    assert decode_frames([topic, body], topic_frame=True) == d


@pytest.mark.parametrize("frames,reason", [
    ([b"register"], "bad_framing"),
    ([b"a", b"b", b"c"], "bad_framing"),
    ([b"register", b"{not json"], "bad_json"),
    ([b"register", b"[1, 2]"], "invalid"),
    ([b"heartbeat", json.dumps({"type": "heartbeat", "version": 99, "engine_id": "e", "client_nonce": "n",
                                "seq": 1}).encode()], "unknown_version"),
    ([b"frobnicate", json.dumps({"type": "frobnicate", "version": 1}).encode()], "unknown_type"),
    ([b"register", encode(Heartbeat(engine_id="e", client_nonce="n", seq=1))[1]], "type_mismatch"),
    ([b"heartbeat", json.dumps({"type": "heartbeat", "version": 1, "engine_id": "bad|id", "client_nonce": "n",
                                "seq": 1}).encode()], "invalid"),
])
def test_bad_frames_are_classified(frames, reason):
    with pytest.raises(DecodeError) as ei:
        decode_frames(frames)
    assert ei.value.reason == reason


def test_oversized_and_non_finite_are_rejected():
    big = TelemetryBatch(engine_id="e0", client_nonce="n", steps=[step(i) for i in range(200)])
    frames = encode(big)
    with pytest.raises(DecodeError) as ei:
        decode_frames(frames, max_bytes=len(frames[1]) - 1)
    assert ei.value.reason == "oversized"
    body = json.loads(encode(TelemetryBatch(engine_id="e0", client_nonce="n", steps=[step()]))[1])
    for bad in ("NaN", "Infinity", -1.0, 0.0):
        body["steps"][0]["step_time_s"] = bad
        raw = json.dumps(body).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity").encode()
        with pytest.raises(DecodeError):
            decode_frames([b"telemetry", raw])
    with pytest.raises(ValueError):
        step(num_running_requests=8, verify_tokens=4)          # B must count one anchor per request
    with pytest.raises(ValueError):
        step(accepted_lens=[5, 0, 0, 0])                       # accepted > verified


def test_unexpected_type_on_a_socket():
    with pytest.raises(DecodeError) as ei:
        decode_frames(encode(StatusRequest()), expect=(Register, Heartbeat))
    assert ei.value.reason == "unexpected_type"


def test_fuzz_never_raises_anything_but_decode_error():
    rnd = random.Random(1234)
    valid = [encode(m) for m in sample_messages()]
    for i in range(3000):
        frames = [bytes(f) for f in rnd.choice(valid)]
        op = i % 5
        if op == 0:
            frames = [bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 200))) for _ in range(rnd.randint(0, 4))]
        elif op == 1:        # flip bytes in the body
            b = bytearray(frames[1])
            for _ in range(rnd.randint(1, 8)):
                b[rnd.randrange(len(b))] = rnd.getrandbits(8)
            frames[1] = bytes(b)
        elif op == 2:        # truncate
            frames[1] = frames[1][: rnd.randrange(len(frames[1]))]
        elif op == 3:        # mutate a JSON value
            obj = json.loads(frames[1])
            key = rnd.choice(list(obj))
            obj[key] = rnd.choice([None, -1, 1e308, "x" * 300, [], {}, True, "NaN"])
            frames[1] = json.dumps(obj).encode()
        try:
            decode_frames(frames)
        except DecodeError:
            pass


def test_policy_validation_messages():
    with pytest.raises(ValueError, match="floor_tok_s"):
        PolicySpec(mode="sla")
    with pytest.raises(ValueError, match="frac"):
        PolicySpec(mode="fixed")
    with pytest.raises(ValueError):
        PolicySpec(mode="fixed", frac=1.5)
    assert PolicySpec(mode="cap", max_tokens=3).describe() == "cap(max=3)"


def test_fingerprint_profile_key_ignores_ranks_only():
    a = fingerprint(tp_rank=0, dp_rank=0)
    assert a.profile_key() == fingerprint(tp_rank=3, dp_rank=1).profile_key()
    assert a.profile_key() != fingerprint(device_name="NVIDIA H100").profile_key()
    assert a.profile_key() != fingerprint(gamma=5).profile_key()
    assert a.profile_key() != fingerprint(tp_size=8).profile_key()


def _profile(model):
    fp = fingerprint()
    return ProfileFile(profile_key=fp.profile_key(), fingerprint=fp, model=SpsModelState(**model.to_state()),
                       heldout_error=ErrorMetrics.from_summary(model.heldout_error()), samples_seen=model.steps,
                       provenance=make_provenance(command="pytest", sglang_version="0.5.23"))


def test_profile_file_roundtrip_atomic_and_schema(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    m = SpsModel()
    for _ in range(300):
        s = synth_step(rng, CURVES["smooth"])
        m.update(s.num_requests, s.verify_tokens, s.step_time_s)
    pf = _profile(m)
    path = tmp_path / "p" / f"{pf.profile_key}.json"
    save_profile(path, pf)
    back = load_profile(path)
    assert back.fingerprint == pf.fingerprint and back.samples_seen == 300
    assert back.provenance.versions["sglang"] == "0.5.23" and back.provenance.command == "pytest"
    m2 = back.model.to_model()
    assert m2.predict_step_time(8, 40) == pytest.approx(m.predict_step_time(8, 40), rel=1e-12)
    assert len(back.model.raw_samples) == 300
    # a failing os.replace leaves the old file intact and no temp files behind
    before = path.read_bytes()
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        save_profile(path, _profile(SpsModel()))
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    schema = export_json_schema()
    assert {"fingerprint", "model", "heldout_error", "provenance", "samples_seen"} <= set(schema["properties"])
    json.dumps(schema)


def test_bad_profile_file_is_explained(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"profile_key": "x"}')
    with pytest.raises(ValueError, match="not a valid DSpark profile"):
        load_profile(p)


def test_profile_update_rebuilds_model():
    rng = np.random.default_rng(1)
    m = SpsModel()
    for _ in range(500):
        s = synth_step(rng, CURVES["jagged"])
        m.update(s.num_requests, s.verify_tokens, s.step_time_s)
    fp = fingerprint()
    upd = ProfileUpdate(profile_key=fp.profile_key(), fingerprint=fp, model=SpsModelState(**m.snapshot_for_prediction()),
                        heldout_error=ErrorMetrics.from_summary(m.heldout_error()), samples_seen=500, issued_at=1.0, seq=1)
    frames = encode_pub(upd)
    got = decode_frames(frames, topic_frame=True).to_sps_model()
    assert got.predict_step_time(16, 100) == pytest.approx(m.predict_step_time(16, 100), rel=1e-12)
    assert len(frames[1]) < 64_000


def _decision(R: int, **kw) -> BudgetDecision:
    fp = fingerprint()
    return BudgetDecision(engine_id="e0", profile_key=fp.profile_key(), policy=PolicySpec(), seq=1, issued_at=1.0,
                          valid_for_s=5.0, num_requests=R, **kw)


def _learned_model() -> SpsModel:
    m = SpsModel()
    rng = np.random.default_rng(0)
    for _ in range(600):
        r = int(rng.integers(1, 33))
        b = int(rng.integers(r, 5 * r + 1))
        m.update(r, b, 0.01 + 0.002 * r + 0.0005 * b)
    return m


def test_decision_curve_is_never_applied_at_another_batch_size():
    from dspark_controller.service.protocol import SpsAdditiveTable, SpsTable

    m = _learned_model()
    table = SpsTable(**m.to_sglang_cost_table(num_requests=4, b_min=4, b_max=20))
    d = _decision(4, sps_table=table)
    assert d.sps_function(4) is not None and d.sps_function(4)(12) == pytest.approx(table.lookup(12))
    # the R = 4 table says nothing about R = 32 (it used to be applied there, clamped at B = 20)
    assert d.sps_function(32) is None
    add = SpsAdditiveTable(**m.to_sglang_additive_table())
    d = _decision(4, sps_table=table, sps_additive=add)
    f = d.sps_function(32)
    for b in (32, 80, 160):
        assert 1.0 / f(b) == pytest.approx(float(m.predict_step_time(32, b)), rel=0.03)


def test_client_carries_the_curve_forward_only_where_it_applies():
    from dspark_controller.service.client import carry_curve
    from dspark_controller.service.protocol import SpsAdditiveTable, SpsTable

    m = _learned_model()
    table = SpsTable(**m.to_sglang_cost_table(num_requests=4, b_min=4, b_max=20))
    add = SpsAdditiveTable(**m.to_sglang_additive_table())
    prev = _decision(4, sps_table=table, sps_additive=add)
    same_r = carry_curve(prev, _decision(4))
    assert same_r.sps_table == table and same_r.sps_additive == add
    other_r = carry_curve(prev, _decision(9))
    assert other_r.sps_table is None and other_r.sps_additive == add        # the table is R = 4's
    fresh = _decision(9, sps_additive=SpsAdditiveTable(**_learned_model().to_sglang_additive_table()))
    assert carry_curve(prev, fresh) is fresh                                  # newer curve wins
    other_profile = _decision(4).model_copy(update={"profile_key": "another-profile"})
    assert carry_curve(prev, other_profile).sps_additive is None
    assert carry_curve(None, other_profile) is other_profile
