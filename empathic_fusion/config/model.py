"""The `model` group: the LightningModule a run trains (`_target_`), the network inside it and how it is optimised.

`net` is free-form: its `_target_` names the network and the other keys are that network's own keyword
arguments (documented in each conf/model/*.yaml beside the values). The module's keys are typed here,
one schema per kind of module: `FusionModelConfig` (conf/model/lf_lstm.yaml, tfn.yaml, ...) and
`TextModelConfig` (text_regressor.yaml, text_finetune.yaml). The optimizer and scheduler come from
conf/optimizer and conf/scheduler (a model YAML picks them in its defaults list).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from empathic_fusion.config.checks import ConfigError, finite, one_of, require
from empathic_fusion.core.branches import MODALITIES

FUSION_HEADS = ("similarity", "regression", "cosine", "constant")  # built by empathic_fusion/models/components/heads.py
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


def _optimizer_problems(optimizer: Dict[str, Any], scheduler: Optional[Dict[str, Any]]) -> list[str]:
    """`model.optimizer.*` / `model.scheduler.*` values out of range (the rest is the optimizer's own business)."""
    problems = []
    if "_target_" not in optimizer:
        problems.append("model.optimizer: must name the optimizer class in _target_ (conf/optimizer)")
    lr, decay = optimizer.get("lr"), optimizer.get("weight_decay")  # an optimizer may take neither
    if lr is not None and not (finite(lr) and lr > 0):
        problems.append(f"model.optimizer.lr={lr}: must be a learning rate > 0")
    if decay is not None and not (finite(decay) and decay >= 0):
        problems.append(f"model.optimizer.weight_decay={decay}: must be a number >= 0")
    if scheduler is not None and scheduler.get("interval", "epoch") not in ("epoch", "step"):
        problems.append(f"model.scheduler.interval={scheduler['interval']}: must be epoch or step")
    return problems


def _check_net(net: Any) -> list[str]:
    if not isinstance(net, dict) or "_target_" not in net:
        return [f"model.net={net}: must be a network config with its class in _target_"]
    return []


@dataclass
class FusionModelConfig:
    """FusionModule (empathic_fusion/models/fusion_module.py): a fusion net over the modalities -> Z -> head."""

    _target_: str = "empathic_fusion.models.fusion_module.FusionModule"
    net: Any = MISSING                           # {_target_: the fusion network, its own keyword arguments}
    head: str = "similarity"                     # similarity: cos(W Z, E(story)) (paper) | regression: MLP on
    #                                              [Z, E(story)] | cosine: cos(Z, E(story)), no projection | constant
    optimizer: Dict[str, Any] = MISSING          # conf/optimizer: {_target_, _partial_: true, lr, weight_decay, ...}
    scheduler: Optional[Dict[str, Any]] = None   # conf/scheduler: {_target_, _partial_: true, interval: epoch | step, ...}
    needs: List[str] = field(default_factory=list)  # modalities the model cannot run without (story_similarity: [text])
    modality_dropout: float = 0.0                # training only: each modality of each window masked as a whole with
    #                                              this probability, never all of a window's (docs/evaluation.md)
    compile: bool = False                        # torch.compile the net and head (docs/scaling.md)
    compile_mode: Optional[str] = None           # null: reduce-overhead (CUDA graphs) on a GPU, default on a CPU
    compile_backend: str = "inductor"            # torch.compile's backend (aot_eager: capture only, no code generation)
    step_graph: bool = False                     # the whole training step (forward, backward, AdamW) as one CUDA graph,
    #                                              replayed every step; eager on a CPU (docs/scaling.md)

    def __post_init__(self) -> None:
        problems = _check_net(self.net) + _optimizer_problems(self.optimizer, self.scheduler)
        try:
            require("model", self, {
                "head": (self.head in FUSION_HEADS, one_of(FUSION_HEADS)),
                "needs": (set(self.needs) <= set(MODALITIES), f"a subset of {list(MODALITIES)}"),
                "modality_dropout": (finite(self.modality_dropout) and 0 <= self.modality_dropout < 1,
                                     "a probability in [0, 1)"),
                "compile_mode": (self.compile_mode is None or self.compile_mode in COMPILE_MODES,
                                 f"null or {one_of(COMPILE_MODES)}")})
        except ConfigError as error:
            problems += error.problems
        if problems:
            raise ConfigError(problems)


@dataclass
class TextBaselinesConfig:
    """Baselines reported next to a text model on every test fold, fitted on the same training rows."""

    enabled: bool = True
    embedding_ridge: bool = True                 # ridge on the frozen encoder's embeddings
    ridge_alpha: Optional[float] = None          # TF-IDF + ridge; null = picked on the validation rows

    def __post_init__(self) -> None:
        require("model.baselines", self, {
            "ridge_alpha": (self.ridge_alpha is None or (finite(self.ridge_alpha) and self.ridge_alpha >= 0),
                            "null or a number >= 0")})


@dataclass
class RobustnessConfig:
    """Perturbation report of the best text checkpoint on the test fold's texts."""

    n_texts: int = 0                             # texts scored under each perturbation (0 = no report)
    levels: List[float] = field(default_factory=lambda: [0.1, 0.3, 0.6])  # graded noise of the character-level perturbations
    report_level: float = 0.3                    # the level the report's table shows (one of levels)

    def __post_init__(self) -> None:
        require("model.robustness", self, {
            "n_texts": (self.n_texts >= 0, "an integer >= 0"),
            "levels": (bool(self.levels) and all(finite(v) and 0 < v <= 1 for v in self.levels),
                       "one or more noise levels in (0, 1]"),
            "report_level": (self.report_level in self.levels, f"one of levels {list(self.levels)}")})


@dataclass
class TextModelConfig:
    """TextEmpathyModule (empathic_fusion/models/text_module.py): a text net over the fields of a table."""

    _target_: str = "empathic_fusion.models.text_module.TextEmpathyModule"
    net: Any = MISSING                           # {_target_: TextRegressor, encoder, head, experts, ...}
    optimizer: Dict[str, Any] = MISSING          # conf/optimizer; its lr is the head's
    scheduler: Optional[Dict[str, Any]] = None   # or a conf/scheduler entry: defaults [/scheduler@scheduler: step_lr]
    encoder_lr: float = 2.0e-5                   # fine-tuned encoder layers
    use_persona: bool = True                     # concatenate persona embeddings (data.persona_columns) to the text
    baselines: TextBaselinesConfig = field(default_factory=TextBaselinesConfig)
    robustness: RobustnessConfig = field(default_factory=RobustnessConfig)

    def __post_init__(self) -> None:
        problems = _check_net(self.net) + _optimizer_problems(self.optimizer, self.scheduler)
        if not (finite(self.encoder_lr) and self.encoder_lr > 0):
            problems.append(f"model.encoder_lr={self.encoder_lr}: must be a learning rate > 0")
        if problems:
            raise ConfigError(problems)
