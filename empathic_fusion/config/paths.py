"""The `paths` group: where data, logs and this run's outputs go."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PathsConfig:
    root_dir: str = "${project_root:}"                # the source checkout, else the working directory
    data_dir: str = "${paths.root_dir}/data"
    log_dir: str = "${paths.root_dir}/logs"
    output_dir: str = "${hydra:runtime.output_dir}"   # this run's folder
