"""The benchmark cannot rot: a smoke run on the CPU with the reference at a tiny shape, and the
cost model on a known case."""
import json

import torch

from dsv4ops import OP_NAMES, ops, tuning_table
from dsv4ops.bench import SHAPE_SETS, cost, step_cases
from dsv4ops.cli import main


def test_bench_smoke(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["bench", "--tiny", "--backends", "reference", "--json", str(path), "--plot", str(tmp_path / "p-")]) == 0
    rows = json.loads(path.read_text())["results"]
    assert sorted(r["op"] for r in rows) == sorted(OP_NAMES)
    assert all(r["backend"] == "reference" and r["us"] > 0 and r["vs_fastest"] == 1.0 for r in rows)
    assert (tmp_path / "p-indexer_topk.png").stat().st_size > 0


def test_gpu_shapes_without_a_gpu_end_at_once(capsys):
    """Production shapes on a machine without a CUDA device: a clear message and exit 2, not hours of
    interpreter time."""
    assert not torch.cuda.is_available()
    assert main(["bench", "--shapes", "production", "--backends", "reference"]) == 2
    assert "--tiny" in capsys.readouterr().err


def test_bench_tiny_honours_ops(tmp_path):
    path = tmp_path / "bench.json"
    assert main(["bench", "--tiny", "--ops", "fp8_einsum", "--backends", "reference", "--json", str(path)]) == 0
    assert [r["op"] for r in json.loads(path.read_text())["results"]] == ["fp8_einsum"]


def test_cost_model_einsum_and_decode():
    kw = dict(a=torch.empty(4, 2, 256, dtype=torch.float8_e4m3fn), a_scale=torch.empty(4, 2, 2),
              b=torch.empty(2, 128, 256, dtype=torch.float8_e4m3fn), b_scale=torch.empty(2, 1, 2),
              out_dtype=torch.bfloat16)
    nbytes, flops = cost("fp8_einsum", kw)
    assert flops == 2 * 4 * 2 * 128 * 256
    assert nbytes == 2048 + 64 + 65536 + 16 + 2048          # a, a_scale, b, b_scale, bf16 out
    idx = torch.tensor([[0, 1, -1, 2]], dtype=torch.int32)
    kw = dict(q=torch.empty(1, 4, 512, dtype=torch.bfloat16), indices=idx, topk_lens=torch.tensor([2], dtype=torch.int32),
              layout="fp8_ds_mla", kv_cache=torch.empty(1, 37440, dtype=torch.uint8))
    nbytes, flops = cost("sparse_mla_decode", kw)
    assert flops == 4 * 2 * 4 * 512 and nbytes == 2 * 584 + 2 * 4 * 512 * 2 + 4 * 4


def test_cost_model_prefill():
    """Prefill is compute-bound: the floor reads each cache byte once, however often rows are selected."""
    idx = torch.tensor([[0, 1, -1, 2], [2, 2, 0, -1]], dtype=torch.int32)
    kw = dict(q=torch.empty(2, 4, 512, dtype=torch.bfloat16), indices=idx, layout="fp8_ds_mla",
              kv_cache=torch.empty(1, 37440, dtype=torch.uint8))
    nbytes, flops = cost("sparse_mla_prefill", kw)
    assert flops == 4 * 6 * 4 * 512 and nbytes == 37440 + 2 * 2 * 4 * 512 * 2 + 2 * 4 * 4


def test_shape_lists_are_valid_cases():
    assert all(c.op for cases in SHAPE_SETS.values() for c in cases())


def test_step_shapes_are_the_decode_steps_calls(monkeypatch):
    """``tune --shapes step`` measures exactly the tuning-table slots (op, bucket, size class) the
    decode-step example dispatches: recorded from a real run of the example (smaller, same form)."""
    from dsv4ops.examples import decode_step

    def slot(op_name, call):
        return op_name, tuning_table.bucket(call.key), call.key.size_class

    dispatched = set()

    def recording(name, validate):
        def record(args):
            call = validate(args)
            dispatched.add(slot(name, call))
            return call
        return record

    for name, op in ops.OPS.items():
        monkeypatch.setattr(op, "validate", recording(name, op.validate))
    decode_step.run_step(decode_step.make_layer(T=4, H=64, context=256), "reference")
    monkeypatch.undo()
    measured = {slot(c.op, ops.OPS[c.op].validate_call(**c.build("cpu", seed=0))) for c in step_cases(4, 64, 256)}
    assert len(dispatched) == 6 and dispatched == measured


def test_cost_model_mqa_logits():
    """Scores inside the ranges only; written bytes: those scores, or the whole [T, S] with clean."""
    T, H, S = 3, 64, 10
    kw = dict(q=torch.empty(T, H, 128, dtype=torch.float8_e4m3fn), k=torch.empty(S, 128, dtype=torch.float8_e4m3fn),
              k_scale=torch.empty(S), weights=torch.empty(T, H), ks=torch.tensor([0, 2, 5], dtype=torch.int32),
              ke=torch.tensor([4, 2, 10], dtype=torch.int32), clean=False)
    inputs = T * H * 128 + S * 128 + S * 4 + T * H * 4 + 2 * T * 4
    assert cost("mqa_logits", kw) == (inputs + 9 * 4, 2 * 9 * H * 128)
    assert cost("mqa_logits", {**kw, "clean": True}) == (inputs + T * S * 4, 2 * 9 * H * 128)


def test_roofline_fraction_is_the_binding_resource():
    """The roofline time is max(bytes / bandwidth, flops / rate): the larger fraction, or none."""
    from dsv4ops.bench import Timing, roofline_fraction

    assert roofline_fraction(Timing("op", "case", "b", us=1.0, bandwidth_fraction=0.3, compute_fraction=0.6)) == 0.6
    assert roofline_fraction(Timing("op", "case", "b", us=1.0, bandwidth_fraction=0.3)) == 0.3
    assert roofline_fraction(Timing("op", "case", "b", us=1.0)) is None


def test_bench_tiny_times_triton_on_a_cpu(capsys, monkeypatch):
    """The tools' CPU rule: without a GPU, bench --tiny turns Triton's interpreter on (said once on
    stderr) and times the Triton kernels, instead of skipping every case."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from dsv4ops.cli import main
    assert main(["bench", "--tiny", "--ops", "indexer_topk", "--backends", "triton"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("TRITON_INTERPRET=1 set") == 1 and "skipped" not in captured.out
    assert "triton" in captured.out
