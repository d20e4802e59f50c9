"""A published configuration pinned from the command line, and sequence parallelism swept beside it."""

from __future__ import annotations

import json

import pytest

from sim.cli import main

SMALL = "gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000"
BASE = ["plan", "--model", SMALL, "--batch", "32", "--hardware", "a100-80gb", "--link", "nvlink3", "--no-progress"]


def _rows(capsys: pytest.CaptureFixture[str], *flags: str) -> list[dict[str, object]]:
    assert main([*BASE, *flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["rows"]  # type: ignore[no-any-return]


def test_every_dimension_pinned_gives_one_row(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows(capsys, "--gpus", "16", "--tensor-parallel", "2", "--pipeline", "2", "--replicas", "4",
                 "--chunks", "4", "--schedule", "interleaved-1f1b", "--virtual", "2", "--checkpoint", "layers",
                 "--zero", "1", "--sequence-parallel", "on")
    assert len(rows) == 1
    (row,) = rows
    want = {"gpus": 16, "tensor_parallel": 2, "stages": 2, "replicas": 4, "chunks": 4,
            "schedule": "interleaved-1f1b", "virtual": 2, "checkpoint": "layers", "zero": 1,
            "sequence_parallel": True}
    assert {k: row[k] for k in want} == want
    assert row["fits"] and row["simulated"] and row["tokens_per_second"] and row["mfu"]


def test_sequence_parallelism_saves_activations_at_the_same_flops(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows(capsys, "--gpus", "4", "--tensor-parallel", "4", "--pipeline", "1", "--chunks", "4",
                 "--schedule", "gpipe", "--checkpoint", "never", "--sequence-parallel", "off,on")
    by = {r["sequence_parallel"]: r for r in rows}
    assert set(by) == {False, True}
    assert max(by[True]["activation_bytes"]) < max(by[False]["activation_bytes"])  # type: ignore[call-overload]
    assert by[True]["mfu"] == pytest.approx(by[False]["mfu"], rel=0.2)


def test_sequence_parallelism_without_tensor_parallelism_is_plain(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows(capsys, "--gpus", "2", "--chunks", "2", "--schedule", "gpipe", "--checkpoint", "never",
                 "--sequence-parallel", "off,on", "--tensor-parallel", "1")
    assert rows and not any(r["sequence_parallel"] for r in rows)


@pytest.mark.parametrize(("model", "flags", "needle"), [
    ("resnet101", ["--sequence-parallel", "on", "--tensor-parallel", "1"], "--sequence-parallel on needs a built-in"),
    (SMALL, ["--sequence-parallel", "yes"], "--sequence-parallel: unknown value 'yes'"),
    (SMALL, ["--tensor-parallel", "3"], "3"),
    (SMALL, ["--tensor-parallel", "16", "--gpus", "16"], "node"),
])
def test_bad_input_is_one_line_before_any_work(capsys: pytest.CaptureFixture[str], model: str, flags: list[str],
                                               needle: str) -> None:
    args = ["plan", "--model", model, "--batch", "32", "--hardware", "a100-80gb", "--gpus", "4", *flags]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_a_target_in_tokens_is_a_target_in_samples_of_the_sequence(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["plan", "--model", SMALL, "--hardware", "a100-80gb,h100-sxm", "--gpus", "1,2", "--chunks", "2",
             "--schedule", "gpipe", "--checkpoint", "never", "--no-progress", "--json", "--target-throughput"]
    assert main([*flags, "12800tokens"]) == 0  # 128 tokens a sample
    tokens = json.loads(capsys.readouterr().out)
    assert main([*flags, "100"]) == 0
    samples = json.loads(capsys.readouterr().out)
    assert tokens == samples and tokens[0]["target_throughput"] == 100


@pytest.mark.parametrize(("model", "target", "needle"), [
    ("resnet101", "1000tokens", "needs a model with a sequence"),
    (SMALL, "fast", "--target-throughput takes samples/s"),
    (SMALL, "-5tokens", "--target-throughput"),
])
def test_a_bad_target_is_one_line(capsys: pytest.CaptureFixture[str], model: str, target: str, needle: str) -> None:
    code = main(["plan", "--model", model, "--hardware", "a100-80gb", f"--target-throughput={target}"])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
