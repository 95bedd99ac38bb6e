"""empathic-fusion's SLURM launcher. Hydra takes launchers only from the `hydra_plugins` namespace package;
what it does around submitit's submission is in empathic_fusion/utils/slurm_jobs.py."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import OmegaConf

from empathic_fusion.utils.slurm_jobs import (FINISHED_DIR, all_finished, check_request, end_sweep_once,
                                              link_job_logs, wait_for_jobs, write_jobs)

log = logging.getLogger(__name__)


class SweepSlurmLauncher(SlurmLauncher):
    """submitit's SLURM launcher that checks its request first and accounts for every job (module docstring)."""

    # in the job ----------------------------------------------------------------------------------------------

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: dict[type, Singleton]) -> JobReturn:
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        link_job_logs(sweep_dir / str(job_num))
        result = super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
        finished = sweep_dir / FINISHED_DIR
        finished.mkdir(parents=True, exist_ok=True)
        (finished / str(job_num)).touch()
        if all_finished(sweep_dir):
            end_sweep_once(sweep_dir, self.config)
        return result

    # in the launching process --------------------------------------------------------------------------------

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        check_request(self.params)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        numbers = [initial_job_idx + i for i in range(len(job_overrides))]
        write_jobs(sweep_dir, numbers, job_overrides)
        executor = submitit.AutoExecutor(cluster="slurm", folder=self.params["submitit_folder"],
                                         slurm_max_num_timeout=self.params["max_num_timeout"])
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in self.params.items()
                                      if k not in ("submitit_folder", "max_num_timeout")})
        log.info("Submitit 'slurm' sweep output dir : %s", sweep_dir)
        for number, overrides in zip(numbers, job_overrides):
            log.info("\t#%d : %s", number, " ".join(filter_overrides(overrides)))
        arguments = [(list(o), "hydra.sweep.dir", n, f"job_id_for_{n}", Singleton.get_state())
                     for n, o in zip(numbers, job_overrides)]
        jobs = executor.map_array(self, *zip(*arguments))
        write_jobs(sweep_dir, numbers, job_overrides, jobs)
        return wait_for_jobs(jobs, numbers, job_overrides, sweep_dir)
