"""``gpipe-sim simulate`` and ``gpipe-sim hardware`` through ``sim.cli.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main

BASE = ["simulate", "--stages", "4", "--chunks", "8", "--checkpoint", "never", "--forward-time", "1",
        "--backward-time", "2"]


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one JSON object, nothing else
    return json.loads(out)


def test_the_closed_form_case(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = run_json(capsys, *BASE, "--out", str(tmp_path))
    assert doc["makespan"] == 33.0
    assert doc["bubble_fraction"] == pytest.approx(3 / 11, rel=1e-12)
    assert len(doc["devices"]) == 4
    assert all(d["busy"] == 24.0 and d["peak_memory_bytes"] == 0 for d in doc["devices"])
    assert doc["schedule"] == "gpipe" and doc["copies"] == "free"


@pytest.mark.parametrize("name", ["interleaved-1f1b", "looped-bfs"])
def test_several_stages_per_device(capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str) -> None:
    """8 stages on 4 devices, m=8: (m·v + p − 1)(t_f + t_b) = (16 + 3)·3 = 57 for both, each device busy 16·3."""
    doc = run_json(capsys, *BASE[:2], "8", *BASE[3:], "--schedule", name, "--devices", "4", "--out", str(tmp_path))
    assert doc["makespan"] == 57.0 and doc["schedule"] == name and doc["n"] == 8
    assert [(d["device"], d["busy"]) for d in doc["devices"]] == [(d, 48.0) for d in range(4)]
    default = run_json(capsys, *BASE, "--schedule", name, "--out", str(tmp_path / "one-per-stage"))
    assert len(default["devices"]) == 4 and default["makespan"] == 33.0  # 1F1B's and GPipe's (m + n − 1)(t_f + t_b)
    assert main([*BASE, "--devices", "2", "--schedule", name, "--out", str(tmp_path / "text")]) == 0
    assert f"{name} schedule: m=8 micro-batches, n=4 stages on 2 devices," in capsys.readouterr().out


def test_default_out_dir_and_files(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(BASE) == 0
    text = capsys.readouterr().out
    assert "makespan 33 s" in text and "bubble fraction 0.2727" in text
    assert "F0@0" in text  # the grid of a small schedule
    out = tmp_path / "out"
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((out / "trace.json").read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 64 and all({"name", "pid", "tid", "ts", "dur"} <= e.keys() for e in complete)
    assert json.loads((out / "timeline.json").read_text())["source"] == "simulated"


def test_a_large_run_skips_its_picture_and_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The limits scaled down (64 spans here): the files are skipped with one line saying how to force them."""
    import sim.cli.simulate as cli_simulate

    monkeypatch.setattr(cli_simulate, "PLOT_SPAN_LIMIT", 10)
    monkeypatch.setattr(cli_simulate, "TRACE_SPAN_LIMIT", 63)
    assert main([*BASE, "--out", str(tmp_path / "big")]) == 0
    text = capsys.readouterr().out
    assert "makespan 33 s" in text and "wrote" not in text
    assert text.strip().splitlines()[-1] == ("(skipped timeline.png (more than 10 spans), trace.json and timeline.json "
                                             "(more than 63): this run has 64 spans; --all-files writes them)")
    assert [f.name for f in (tmp_path / "big").iterdir()] == [".gpipe-sim.json"]  # the manifest alone
    monkeypatch.setattr(cli_simulate, "TRACE_SPAN_LIMIT", 64)
    assert main([*BASE, "--json", "--out", str(tmp_path / "medium")]) == 0
    captured = capsys.readouterr()  # with --json, stdout holds the JSON object alone and the note goes to stderr
    assert captured.out.count("\n") == 1 and json.loads(captured.out)["files"].keys() == {"timeline", "trace"}
    assert captured.err == ("(skipped timeline.png (more than 10 spans): this run has 64 spans; --all-files writes "
                            "them; open trace.json in https://ui.perfetto.dev)\n")
    assert main([*BASE, "--all-files", "--out", str(tmp_path / "all")]) == 0
    assert "skipped" not in capsys.readouterr().out
    files = ["timeline.json", "timeline.png", "trace.json"]
    assert sorted(f.name for f in (tmp_path / "all").iterdir()) == [".gpipe-sim.json", *files]
    monkeypatch.setattr(cli_simulate, "TRACE_SPAN_LIMIT", 63)  # the earlier run's files do not stay beside it
    assert main([*BASE, "--force", "--out", str(tmp_path / "all")]) == 0
    assert [f.name for f in (tmp_path / "all").iterdir()] == [".gpipe-sim.json"]


def test_memory_copies_and_hardware(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = run_json(capsys, "simulate", "--stages", "2", "--chunks", "4", "--checkpoint", "always",
                   "--saved-bytes", "1000", "--activation-bytes", "10", "--model-state-bytes", "5",
                   "--hardware", "A100-80GB", "--link", "pcie3-x16", "--out", str(tmp_path))
    assert [d["peak_memory_bytes"] for d in doc["devices"]] == [4 * 10 + 1000] * 2
    assert doc["devices"][0]["model_state_bytes"] == 5
    assert 0 < doc["devices"][0]["memory_fraction"] < 1e-6
    assert doc["copies"].startswith("pcie3-x16") and doc["makespan"] > (4 + 1) * 3


def test_switches_change_the_result(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = ["--out", str(tmp_path), "--force"]  # each run replaces the last one's files
    base = run_json(capsys, *BASE, "--copy-time", "0.5", *out)["makespan"]
    assert run_json(capsys, *BASE, "--copy-time", "0.5", "--no-copy-streams", *out)["makespan"] > base
    assert run_json(capsys, *BASE, "--copy-time", "0.5", "--lockstep", *out)["makespan"] > base
    assert run_json(capsys, *BASE, "--no-fork-join", *out)["makespan"] > 33.0
    assert run_json(capsys, *BASE, "--schedule", "1f1b", *out)["makespan"] == 33.0
    custom = run_json(capsys, *BASE, "--activation-bytes", "100", "--bandwidth", "100", "--latency", "0.5", *out)
    assert custom["copies"] == "custom: 1.5 s each"


def test_costs_per_stage(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """One value per stage: a heavy first and last stage make 1F1B's makespan that of the slowest stage's work plus
    the pipeline's fill and drain through each stage once (free copies): (m - 1) * 6 + (2 + 1 + 1 + 2) + (4 + 2 + 2 +
    4) for F 2,1,1,2 and B 4,2,2,4."""
    doc = run_json(capsys, "simulate", "--schedule", "1f1b", "--stages", "4", "--chunks", "8", "--forward-time",
                   "2,1,1,2", "--backward-time", "4,2,2,4", "--out", str(tmp_path / "a"))
    assert doc["makespan"] == pytest.approx(7 * 6 + 6 + 12)
    assert [d["busy"] for d in doc["devices"]] == pytest.approx([48, 24, 24, 48])
    same = run_json(capsys, "simulate", "--schedule", "1f1b", "--stages", "4", "--chunks", "8", "--forward-time", "1",
                    "--backward-time", "2,2,2,2", "--out", str(tmp_path / "b"))
    assert same["makespan"] == pytest.approx((8 + 3) * 3)  # one value for all, or the same value four times


def test_weight_time_is_a_w_task_or_part_of_the_backward(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """ZB-H1 runs --weight-time as W tasks: 8 x 3 + 3 x (1 + 1 - 1) = 27; 1F1B and GPipe run B + W as one
    backward of 2, as with --backward-time 2 alone (33); zb-v places its 4 stages on 2 devices."""
    out = ["--out", str(tmp_path), "--force"]
    split = [*BASE[:-1], "1", "--weight-time", "1", *out]  # --backward-time 1
    zb = run_json(capsys, *split, "--schedule", "zb-h1")
    assert zb["makespan"] == 27.0 and zb["schedule"] == "zb-h1"
    assert all(d["busy"] == 24.0 for d in zb["devices"])
    assert run_json(capsys, *split, "--schedule", "1f1b")["makespan"] == 33.0
    assert run_json(capsys, *split)["makespan"] == 33.0  # gpipe
    v = run_json(capsys, *split, "--schedule", "zb-v")
    assert v["makespan"] == 2 * 8 * 3 + 1 and len(v["devices"]) == 2


@pytest.mark.parametrize(("args", "message"), [
    (["--forward-time", "-1"], "--forward-time must be a finite number of seconds >= 0"),
    (["--weight-time", "-1"], "--weight-time must be a finite number of seconds >= 0"),
    (["--schedule", "zb-v", "--stages", "5"], "zb-v runs n = 2p stages, two per device in a V; got n=5: give an even"),
    (["--backward-time", "nan"], "--backward-time must be a finite number"),
    (["--copy-time", "inf"], "--copy-time must be a finite number"),
    (["--chunks", "0"], "--chunks must be >= 1"),
    (["--forward-time", "1,2"], "--forward-time takes one value or 4 (one per stage), got 2"),
    (["--weight-time", "1,,1,1"], "--weight-time takes one number or 4 separated by commas"),
    (["--recompute-time", "1,x,1,1"], "--recompute-time takes numbers of seconds"),
    (["--backward-time", "1,2,-1,2"], "--backward-time must be a finite number of seconds >= 0, got -1"),
    (["--devices", "0"], "--devices 0 is out of range: it takes integers from 1 to 4"),
    (["--devices", "2"], "--schedule gpipe runs one stage per device: use --devices 4 (or leave it out), or a "
                         "schedule that places several stages per device: interleaved-1f1b, looped-bfs"),
    (["--devices", "3", "--schedule", "interleaved-1f1b"], "a multiple of the 3 devices: 3 or 6"),
    (["--devices", "2", "--schedule", "interleaved-1f1b:round=0"],
     "schedule 'interleaved-1f1b' takes the option round=N (N a positive integer"),
    (["--schedule", "zigzag"], "unknown schedule 'zigzag'; registered: gpipe, 1f1b,"),
    (["--stages", "0"], "--stages must be >= 1"),
    (["--saved-bytes", "-5"], "--saved-bytes must be >= 0"),
    (["--bandwidth", "0"], "--bandwidth must be a finite number of bytes/s > 0"),
    (["--latency", "1"], "--latency needs --bandwidth"),
    (["--hardware", "tpu"], "unknown device 'tpu'; known devices: tesla-p40"),
    (["--link", "smoke-signals"], "unknown link 'smoke-signals'; known links: pcie3-x16"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                          args: list[str], message: str) -> None:
    assert main([*BASE, *args, "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpipe-sim simulate: error: ") and message in lines[0]
    assert "Traceback" not in captured.err and captured.out == ""


def test_hardware_lists_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hardware"]) == 0
    text = capsys.readouterr().out
    for name in ("tesla-p40", "h200", "cpu", "pcie4-x16", "nvlink4", "cpu-memcpy"):
        assert name in text
    assert main(["hardware", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {d["name"] for d in doc["devices"]} >= {"a100-40gb", "h100-sxm"}
    assert next(link for link in doc["links"] if link["name"] == "infiniband-hdr")["bandwidth"] == 25e9


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("args", "message"), [
    (["--chunks", "1000000000"], "--chunks 1000000000 on --stages 4: the simulation (4,000,000,000 micro-batch-stage "
                                 "pairs) needs about 7.28 TiB of memory, more than the "),
    (["--stages", "1000000000000", "--chunks", "1"], "lower --chunks or --stages"),
])
def test_a_run_too_large_for_this_machine_is_refused_before_it_is_built(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str) -> None:
    """``--chunks 1000000000`` once ended in a MemoryError traceback, ``--stages 100000`` in the kernel's kill."""
    assert main([*BASE, *args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpipe-sim simulate: error: ") and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_the_memory_limit_counts_the_stages_the_files_and_an_imported_schedule(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With 256 MiB said to be available (Note [bytes of a simulation] in sim.core.size)."""
    monkeypatch.setattr("gpipe.schedule.size.available_bytes", lambda: 256 * 2**20)
    assert main([*BASE, "--stages", "20000", "--chunks", "1", "--out", str(tmp_path / "a")]) == 2
    assert "--chunks 1 on --stages 20000: the simulation (20,000 micro-batch-stage pairs)" in capsys.readouterr().err
    assert main([*BASE, "--chunks", "20000", "--all-files", "--out", str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.endswith("available on this machine: leave out --all-files\n")
    assert main([*BASE, "--chunks", "2000", "--export-schedule", str(tmp_path / "s.csv"),
                 "--out", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    monkeypatch.setattr("gpipe.schedule.size.available_bytes", lambda: 16 * 2**20)
    assert main([*BASE, "--import-schedule", str(tmp_path / "s.csv"), "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert f"--import-schedule {tmp_path / 's.csv'} (m=2000, n=4): the simulation" in err
    assert err.endswith("import a schedule of fewer micro-batches or stages\n")
    assert not any((tmp_path / x).exists() for x in "abd")
