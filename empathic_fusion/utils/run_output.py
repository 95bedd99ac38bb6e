"""What a run prints: data warnings once each with a count at the end, no third-party log noise.

Data warnings (a session whose video and audio differ in length, a masked branch, ...) go through
`warn_data`: each distinct message is logged once per run at WARNING, however many steps meet it, and
`data_warning_summary` counts them for the end of the run. Third-party noise (MediaPipe's and TFLite's
C++ log lines, Lightning's banners and tips, the sentence encoder's loading messages and bars) is
silenced unless the run sets `verbose=true`.

Every entry point ends with `what_now`: the run folder, the files to open (the results table, the plots,
test_predicted_vs_true.png first) and the command to run next, so nobody has to look for the run folder.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger("empathic_fusion.data")
VERBOSE_ENV = "EMPATHIC_FUSION_VERBOSE"  # read by worker processes, which do not see the run's config
THIRD_PARTY_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning", "absl", "sentence_transformers",
                       "transformers", "huggingface_hub")
THIRD_PARTY_MODULES = r"(lightning|torch|transformers|sentence_transformers|huggingface_hub|mediapipe)(\.|$)"
# glog/absl lines (I0000/W0000 00:00:... file.cc:123]) and TFLite's banners; E and F lines are kept
NATIVE_NOISE = re.compile(r"^(?:[IW]\d{4} [\d:.]+\s+\d+ [\w./-]+:\d+\]|INFO: Created TensorFlow Lite"
                          r"|WARNING: All log messages before absl::InitializeLog)")

PLOT_FIRST = "test_predicted_vs_true.png"  # the figure to open first: predictions against the ratings

_seen: dict[str, None] = {}


def reset_data_warnings() -> None:
    """Start a run: every data warning will be logged again once."""
    _seen.clear()


def warn_data(message: str) -> None:
    """Log a warning about the data at WARNING, once per run."""
    if message not in _seen:
        _seen[message] = None
        log.warning(message)


def data_warning_summary() -> str | None:
    """'N data warning(s) in this run (above)' or None when there were none."""
    return f"{len(_seen)} data warning(s) in this run, listed above" if _seen else None


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") == "1"


def set_verbosity(show_third_party: bool) -> None:
    """Silence (or restore) third-party logging for this process and the worker processes it starts.

    Lightning and transformers set their loggers' levels when they are imported, so the levels are set
    again right after that import (`_LevelsAfterImport`) rather than by importing them here: a command that
    never trains (extract.py, and the dataset errors it stops at) does not pay the seconds Lightning takes to
    import."""
    os.environ[VERBOSE_ENV] = "1" if show_third_party else "0"
    if not show_third_party:
        for category in (DeprecationWarning, FutureWarning):  # about the libraries' own code, not the user's
            warnings.filterwarnings("ignore", category=category, module=THIRD_PARTY_MODULES)
        # Lightning's hint on any machine with srun, for every single-process run (SLURM jobs of a sweep run
        # under srun already: hydra/launcher=submitit_slurm)
        warnings.filterwarnings("ignore", message="The `srun` command is available on your system but is not used")
        # the encoder's "Loading weights" bars (read at import; set for workers too)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    _set_levels(show_third_party)
    _LevelsAfterImport.watch(show_third_party)


def _set_levels(show_third_party: bool) -> None:
    """The third-party loggers' levels, and the progress bars of the Hugging Face libraries already imported."""
    if not show_third_party:
        if "huggingface_hub" in sys.modules:
            sys.modules["huggingface_hub"].utils.disable_progress_bars()
        if "transformers" in sys.modules:
            sys.modules["transformers"].utils.logging.disable_progress_bar()
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if show_third_party else logging.WARNING)
    if show_third_party:
        logging.getLogger("lightning.pytorch").setLevel(logging.INFO)


class _LevelsAfterImport(importlib.abc.MetaPathFinder):
    """Sets the levels again as soon as a library that sets its own at import (`LEVELS_SET_AT_IMPORT`) has been
    imported: first in sys.meta_path, it wraps that library's loader (steps aside for everything else) and leaves
    sys.meta_path once all of them are imported. A spec only looked up (an is-it-installed check) changes nothing."""

    LEVELS_SET_AT_IMPORT = ("lightning", "transformers")
    _pending: _LevelsAfterImport | None = None

    def __init__(self, show_third_party: bool):
        self.show_third_party = show_third_party

    @classmethod
    def watch(cls, show_third_party: bool) -> None:
        if cls._pending is not None:
            cls._pending.show_third_party = show_third_party
        elif not all(name in sys.modules for name in cls.LEVELS_SET_AT_IMPORT):
            cls._pending = cls(show_third_party)
            sys.meta_path.insert(0, cls._pending)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in self.LEVELS_SET_AT_IMPORT:
            return None
        spec = next((s for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec")
                     for s in [finder.find_spec(name, path, target)] if s is not None), None)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            load(module)
            self.imported()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def imported(self) -> None:
        _set_levels(self.show_third_party)
        if all(name in sys.modules for name in self.LEVELS_SET_AT_IMPORT) and self in sys.meta_path:
            sys.meta_path.remove(self)  # nothing left to watch
            type(self)._pending = None


@contextmanager
def native_logs_filtered() -> Iterator[None]:
    """Drop the info/warning lines that native libraries (MediaPipe, TFLite) write straight to file
    descriptor 2 while the block runs; everything else written there is passed on when it ends. A no-op
    with verbose output."""
    if verbose():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode(errors="replace").splitlines(keepends=True)
                    if not NATIVE_NOISE.match(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def shown(path: str | Path) -> str:
    """A path as the user would type it here: relative to the working directory when inside it."""
    path = Path(os.path.abspath(path))
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def plots(folder: Path) -> list[Path]:
    """The figures a run wrote into its folder, test_predicted_vs_true.png first."""
    return sorted(Path(folder).glob("*.png"), key=lambda p: (p.name != PLOT_FIRST, p.name))


def plot_list(folder: Path, where: str | None = None) -> str | None:
    """The figures of `folder` by name (and how many session timelines), `where` they are said to be when
    given, or None when there are none."""
    names = [p.name for p in plots(folder)]
    timelines = len(list((Path(folder) / "test_timelines").glob("*.png")))
    if timelines:
        names.append(f"test_timelines/ ({timelines} session(s))")
    return (", ".join(names) + (f" (in {where})" if where else "")) if names else None


def what_now(rows: list[tuple[str, str | None]]) -> str:
    """The block an entry point prints last: where its outputs are and what to run next, one `name  value`
    line each; rows without a value are left out."""
    kept = [(name, value) for name, value in rows if value]
    width = max((len(name) for name, _ in kept), default=0)
    return "\n".join(["", "What now:", *(f"  {name:<{width}}  {value}" for name, value in kept)])
