"""The command line: every bad flag, path or setting is one clear line and a non-zero exit, found
before anything runs; never a traceback."""
import subprocess
import sys

import pytest

import dsv4ops
from dsv4ops import settings
from dsv4ops.cli import main


def fails(capsys, argv, *expected, code=2) -> str:
    assert main(argv) == code
    captured = capsys.readouterr()
    for text in expected:
        assert text in captured.err
    assert "Traceback" not in captured.err + captured.out
    return captured.out


@pytest.mark.parametrize("command", ["check", "bench"])
def test_unknown_backend_or_op(capsys, command):
    out = fails(capsys, [command, "--backends", "nonexistent", "--ops", "indexer_topk"],
                "--backends: unknown backend(s) 'nonexistent'; backends are ", "reference")
    assert out == ""                                              # nothing ran
    fails(capsys, [command, "--ops", "indexer_topk,nope"], "--ops: unknown op(s) 'nope'")


@pytest.mark.parametrize("command", ["check", "bench"])
def test_json_into_a_missing_folder_fails_before_the_run(capsys, tmp_path, command):
    path = tmp_path / "missing" / "out.json"
    out = fails(capsys, [command, "--backends", "reference", "--ops", "indexer_topk", "--json", str(path)],
                f"--json '{path}': cannot write (No such file or directory)")
    assert "conformance" not in out and not path.parent.exists()


@pytest.mark.parametrize("device,expected", [
    ("bogus", "--device 'bogus': not a torch device"),
    ("cuda:7", "--device 'cuda:7': no such device here"),
])
def test_bad_device(capsys, device, expected):
    fails(capsys, ["check", "--backends", "reference", "--ops", "indexer_topk", "--device", device], expected)


@pytest.mark.parametrize("seed", ["-1", str(2 ** 64)])
def test_bad_seed(capsys, seed):
    fails(capsys, ["check", "--backends", "reference", "--ops", "indexer_topk", f"--seed={seed}"],
          f"--seed {seed}: expected an integer in [0, 2**62)")


def test_no_matching_case(capsys):
    fails(capsys, ["check", "--backends", "reference", "--ops", "indexer_topk", "--case", "nope"],
          "no case matches --case 'nope'")


def test_plot_without_matplotlib(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # import matplotlib -> ImportError
    fails(capsys, ["bench", "--tiny", "--backends", "reference", "--plot", str(tmp_path / "p-")],
          "--plot needs matplotlib")


def test_plot_into_a_missing_folder(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    fails(capsys, ["bench", "--tiny", "--backends", "reference", "--plot", str(tmp_path / "no" / "p-")],
          "does not exist or is not writable")


def test_bench_that_times_nothing_fails(capsys):
    """flashmla cannot run on the CPU: every case is skipped, which is not a successful benchmark."""
    fails(capsys, ["bench", "--tiny", "--ops", "fp8_einsum", "--backends", "flashmla"], "nothing was timed", code=1)


@pytest.mark.parametrize("name,value,expected", [
    ("DSV4OPS_BACKEND", "nonsense_op=triton", "DSV4OPS_BACKEND: bad entry 'nonsense_op=triton'"),
    ("DSV4OPS_PLATFORM", "tpu", "DSV4OPS_PLATFORM"),
])
def test_bad_environment(capsys, monkeypatch, name, value, expected):
    monkeypatch.setenv(name, value)
    settings.reload()
    try:
        fails(capsys, ["info"], "dsv4ops info: error: ", expected)
    finally:
        monkeypatch.delenv(name)
        settings.reload()


def test_bad_environment_in_a_real_process():
    """The installed entry point: one line on stderr, exit status 2, no traceback."""
    env = {"PATH": "", "DSV4OPS_BACKEND": "*=nope"}
    proc = subprocess.run([sys.executable, "-m", "dsv4ops.cli", "info"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("dsv4ops info: error: DSV4OPS_BACKEND: bad entry '*=nope': unknown backend 'nope'")


def test_tune_unknown_shape_set(capsys, tmp_path):
    out = fails(capsys, ["tune", "--shapes", "production,nope", "--out", str(tmp_path / "t.json")],
                "--shapes: unknown set(s) 'nope'; sets are production, sweep, step or all")
    assert out == "" and not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("verbose", [False, True])
def test_info_fits_120_columns(capsys, monkeypatch, verbose):
    """Op lists wrapped, decision reasons cut to one line (in full, wrapped, with --verbose), a
    backend's unavailability wrapped whole (it ends in what to install); the FlashMLA /
    DeepGEMM install advice for this torch and the installed DeepGEMM API generation are shown."""
    from fakes import deep_gemm as fake_deep_gemm
    from fakes import reprobed
    from dsv4ops.vendor_wheels import install_hint

    fake_deep_gemm.install(monkeypatch, "2.8")
    monkeypatch.setitem(sys.modules, "flash_mla", None)                 # not importable: a reason to show
    with reprobed(monkeypatch, "deepgemm"), reprobed(monkeypatch, "flashmla"):
        assert main(["info"] + (["--verbose"] if verbose else [])) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120
    joined = " ".join(line.strip() for line in out.splitlines())
    assert f"FlashMLA / DeepGEMM wheels {install_hint()}" in joined
    assert "reference   yes" in out and f"all {len(dsv4ops.OP_NAMES)}" in out
    assert ("DeepGEMM paged and prefill MQA logits, fp8 einsum (SM90 recipe); installed: API 2.8" in joined) == verbose
    reason = "flashmla unavailable: cannot import flash_mla (ModuleNotFoundError: import of flash_mla halted; None in sys.modules)"
    assert reason in joined
    assert f"install tokenspeed-flashmla, {install_hint(('tokenspeed-flashmla',))}" in joined   # never cut


def test_vendor_wheel_table():
    """The pip line per torch (--no-deps: the torch 2.14 builds pin torch==2.14.0), none for a torch
    without a known build, and the [flashmla] / [deepgemm] extras pin the torch 2.11 row (no torch declared)."""
    import pathlib
    import tomllib

    from dsv4ops.vendor_wheels import WHEELS, install_hint, install_line

    assert install_line("2.14.1+cu130") == ("pip install --no-deps tokenspeed-deepgemm==2.8.2.post20261020 "
                                            "tokenspeed-flashmla==1.0.0.post20260924")
    assert install_line("2.13.0+cpu") is None
    assert install_hint(("tokenspeed-flashmla",), "2.13.0+cpu") == (
        "no tokenspeed-flashmla build known for torch 2.13 (torch 2.11: tokenspeed-flashmla==1.0.0.post20260615; "
        "torch 2.14: tokenspeed-flashmla==1.0.0.post20260924)")
    extras = tomllib.loads((pathlib.Path(__file__).parent.parent / "pyproject.toml").read_text())
    extras = extras["project"]["optional-dependencies"]
    assert extras["deepgemm"] == [f"tokenspeed-deepgemm=={WHEELS['2.11']['tokenspeed-deepgemm']}"]
    assert extras["flashmla"] == [f"tokenspeed-flashmla=={WHEELS['2.11']['tokenspeed-flashmla']}"]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"dsv4ops {dsv4ops.__version__}"


@pytest.mark.parametrize("command", ["info", "check", "bench", "tune", "warmup"])
def test_help_states_each_default_once(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    options = capsys.readouterr().out.split("\n  -")[1:]           # one block per option
    assert options and all(block.count("default") <= 1 for block in options), options


def test_info_check_fails_when_an_op_has_no_implementation(capsys, env):
    """``info --check`` is a preflight: exit 1 when a DSV4OPS_BACKEND pin leaves an op unserved
    (plain ``info`` still exits 0), 0 when every op has an implementation."""
    assert main(["info", "--check"]) == 0
    captured = capsys.readouterr()
    assert f"dsv4ops {dsv4ops.__version__}" in captured.out
    assert "every op has an implementation here" in captured.out and captured.err == ""
    env(DSV4OPS_BACKEND="flashmla")
    assert main(["info", "--check"]) == 1
    err = capsys.readouterr().err
    assert f"no implementation serves {len(dsv4ops.OP_NAMES)} of {len(dsv4ops.OP_NAMES)} ops here" in err
    assert main(["info"]) == 0


def test_check_full_tier_on_a_cpu_is_refused(capsys):
    fails(capsys, ["check", "--tier", "full", "--ops", "indexer_topk", "--device", "cpu"],
          "--tier full: the production shapes are GPU-sized", "--allow-cpu-full")


def test_check_output_on_a_non_terminal(capsys):
    """One case through the CLI as CI runs it (stderr no terminal): a progress line per op, the
    run's duration, ops as rows within 120 columns, backends that cannot run here listed once
    (not counted as skipped), and what --repeat compared."""
    from dsv4ops.conformance import select_cases

    case = select_cases(["indexer_topk"], "quick")[0]
    assert main(["check", "--ops", "indexer_topk", "--backends", "triton,flashmla,reference", "--case", case.id,
                 "--repeat", "2", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert "checked indexer_topk: 2 passed, 0 failed, 0 declined" in captured.err
    out = captured.out.splitlines()
    assert max(map(len, out)) <= 120
    assert out[0].startswith("conformance, tier quick, on cpu") and out[0].endswith(" s") and "1 cases in " in out[0]
    assert out[1].split() == ["op", "triton", "reference"] and out[3].split()[:3] == ["indexer_topk", "pass", "1"]
    assert any(line.startswith("  not run: flashmla: platform cpu not supported") for line in out)
    assert "--repeat 2: every passing case was launched 2 times;" in captured.out
    assert out[-1] == "2 passed, 0 failed, 0 declined (cases an implementing backend cannot serve here)"


def test_check_matrix_splits_into_tables_of_at_most_120_columns():
    from dsv4ops.cli import _matrix_tables
    from dsv4ops.conformance import Cell

    names = [f"backend{i}" for i in range(9)]
    cells = {(n, op): Cell(passed=12, skipped=3, worst=0.5) for n in names for op in dsv4ops.OP_NAMES}
    tables = _matrix_tables(cells, names, list(dsv4ops.OP_NAMES))
    assert len(tables) > 1 and all(len(line) <= 120 for t in tables for line in t.splitlines())
    headers = [t.splitlines()[0].split() for t in tables]
    assert all(h[0] == "op" for h in headers) and [n for h in headers for n in h[1:]] == names


def test_decode_step_example_says_which_backends_ran(capsys):
    """The example names the backends each setting ran, says when that is the reference against
    itself, and reports a setting nothing here can serve as a line, not a traceback."""
    from dsv4ops.examples import decode_step

    code = decode_step.main(["--device", "cpu", "--tokens", "2", "--heads", "8", "--context", "200",
                             "--index-topk", "32", "--settings", "triton", "reference", "flashmla"])
    out = capsys.readouterr().out
    assert code == 1 and "Traceback" not in out                  # flashmla cannot run on a CPU
    assert "backends: triton: 6 ops" in out
    assert "backends: every op ran on the reference: this compares the reference with itself" in out
    assert "flashmla" in out and "error: UnsupportedError" in out
