"""Where the package keeps its configs and where a run writes by default.

`CONFIG_DIR` is the Hydra config tree shipped inside the package (also reachable as
`pkg://empathic_fusion.conf`). `PROJECT_ROOT` is the default root of `data/` and `logs/`: the source
checkout when the package runs from one (editable install, tests, the top-level scripts), otherwise the
working directory, so an installed `empathic-train` writes next to where it is started.
Resolvers registered here: `${project_root:}`, and `${if_null:${key},default}` (the key's value unless null);
the SLURM request's in utils/slurm_request.py.
"""
import warnings
from pathlib import Path

from omegaconf import OmegaConf

PACKAGE_DIR = Path(__file__).resolve().parents[1]
CONFIG_DIR = PACKAGE_DIR / "conf"
SOURCE_ROOT = PACKAGE_DIR.parent if (PACKAGE_DIR.parent / "pyproject.toml").is_file() else None
PROJECT_ROOT = SOURCE_ROOT or Path.cwd()

if not OmegaConf.has_resolver("project_root"):
    OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT))
if not OmegaConf.has_resolver("if_null"):  # ${if_null:${out_dir},<default>}: a setting, else a default
    OmegaConf.register_new_resolver("if_null", lambda value, default: default if value is None else value)

# conf/hydra/launcher/submitit_{slurm,local}.yaml keep the plugin's names (hydra/launcher=submitit_slurm) and are
# meant to be checked against its schema; Hydra warns about that matching on every composition, before any of
# the project's callbacks is imported, so the filter sits here, imported by every entry point first.
warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/submitit_(slurm|local)' is validated against ConfigStore",
                        category=UserWarning)

# the SLURM launcher's request resolvers (${slurm_gpus:${trainer}}, ...), which conf/hydra/launcher needs
import empathic_fusion.utils.slurm_request  # noqa: E402,F401

# the typed config groups' schemas, which every composition of CONFIG_DIR needs (registered on import)
import empathic_fusion.config  # noqa: E402,F401
