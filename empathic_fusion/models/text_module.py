"""Text regressor (Haleas, "Exploring the Empathy of Leading Large Language Models"): encoder -> pooled field embeddings [+ persona] -> MLP ->
one score per label; the overall score is the mean of the label scores (Empathy = (C+E+B)/3).
The default adds stacked ridge experts (empathic_fusion/models/text/experts.py: TF-IDF and one ridge per field on the
frozen embeddings) and puts the head over their scores; see TextRegressor.

`TextEmpathyModule` is the LightningModule every text model trains as (models/base.py), built from
config like the fusion models: `net` (a `_target_`, with its `encoder` a `_target_` too: frozen and cached, or the
top n layers fine-tuned; pooling is the encoder's; `head` a `_partial_`; an optional extra
`branch`, empathic_fusion/models/text/branches.py), `optimizer` and `scheduler` (`_partial_`
configs, conf/optimizer, conf/scheduler). Persona conditioning ("Talk, Listen, Connect"): each
categorical attribute gets an embedding, numeric attributes a linear map, concatenated to the text
representation; `use_persona=False` drops it. Targets are standardised with the training fold's
statistics (kept in the checkpoint); MSE is taken on that scale.

Checkpoints describe themselves: `hyper_parameters` hold the net/optimizer configs and `data_info`
(fields, labels, persona vocabulary, target scaling, levels); the header (`checkpoint["empathic_fusion"]`,
models/base.py) adds the encoder's folder and identity hash, checked when the checkpoint is loaded,
and the fitted experts' stack report. The test report is empathic_fusion/evaluation/text_report.py's
(the shared one of empathic_fusion/evaluation/report_parts.py, with the baselines, per-label rows and level metrics).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import hydra
import lightning as L
import numpy as np
import torch
from torch import nn

from empathic_fusion.core.registry import register_model
from empathic_fusion.core.sentence_encoder import SentenceEncoder
from empathic_fusion.models.contracts import TextBranch, TextExpert, check_part
from empathic_fusion.datamodules.text_datamodule import TextDataModule
from empathic_fusion.datamodules.text_table import PersonaEncoder
from empathic_fusion.metrics import metric_values
from empathic_fusion.datamodules.build import set_up
from empathic_fusion.models.base import HEADER_KEY, EmpathyLightningModule
from empathic_fusion.models.text.experts import GRID_END_NOTES, stack_weights

log = logging.getLogger(__name__)
OVERALL = "overall"  # the mean of the label scores, reported and served beside them


class PersonaEmbedding(nn.Module):
    """Categorical ids -> embeddings, numeric z-scores -> linear; concatenated."""

    def __init__(self, cardinalities: list[int], n_numeric: int, dim: int):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(n, dim) for n in cardinalities)
        self.numeric = nn.Linear(n_numeric, dim) if n_numeric else None
        self.out_dim = dim * (len(cardinalities) + (1 if n_numeric else 0))

    def forward(self, ids: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        parts = [emb(ids[:, j]) for j, emb in enumerate(self.embeddings)]
        if self.numeric is not None:
            parts.append(self.numeric(numeric))
        return torch.cat(parts, dim=-1)


@register_model("mlp_head", aliases=("empathic_fusion.text.model.MLPHead",))
class MLPHead(nn.Sequential):
    """Dropout -> Linear -> GELU -> Dropout -> Linear: one output per label."""

    def __init__(self, in_dim: int, n_outputs: int, hidden: int = 256, dropout: float = 0.1):
        super().__init__(nn.Dropout(dropout), nn.Linear(in_dim, hidden), nn.GELU(), nn.Dropout(dropout),
                         nn.Linear(hidden, n_outputs))


@register_model("text_regressor", aliases=("empathic_fusion.text.model.TextRegressor",), module="text")
class TextRegressor(nn.Module):
    """Shared encoder over every text field, optional persona, MLP head with one output per label,
    optionally over a stack of ridge experts (empathic_fusion/models/text/experts.py).

    With a frozen encoder the net holds no encoder (its weights stay out of checkpoints): batches
    bring the cached field embeddings (`embeddings`, fields concatenated), so a step is only the
    head. A fine-tuned encoder is part of the net and reads the batch's raw `texts`.
    `head` builds the head from (input dim, outputs) (a `_partial_` config; default MLPHead); an
    optional `branch` (empathic_fusion/models/text/branches.py, e.g. TF-IDF) adds features computed from the texts.

    With `experts`, the output is their non-negative weighted sum (weights fitted on their held-out
    predictions, `fit_experts`) plus the head, which starts at zero and learns what the linear stack
    misses. `head_input` says what the head reads: `embeddings` (the field embeddings; the recipe
    without experts) or `expert_scores` (the experts' scores: a nonlinear stacker with a few inputs,
    where persona and branch features can interact with the scores; a head on 384-d embeddings per
    field next to the experts only fitted noise on EmpatheticExchanges). On training rows the
    experts' held-out predictions stand in for their scores (`batch["expert_scores"]`).
    """

    def __init__(self, fields: list[str], n_outputs: int, encoder: SentenceEncoder,
                 head: Callable[[int, int], nn.Module] | None = None, branch: TextBranch | None = None,
                 experts: list[TextExpert] | None = None, head_input: str = "embeddings",
                 persona_cardinalities: list[int] | None = None, persona_numeric: int = 0, persona_dim: int = 8):
        super().__init__()
        self.encoder = None if encoder.frozen else encoder
        self.fields = list(fields)
        cards = persona_cardinalities or []
        self.persona = PersonaEmbedding(cards, persona_numeric, persona_dim) if (cards or persona_numeric) else None
        for part in (*(experts or []), *([branch] if branch is not None else [])):
            check_part(part, TextBranch if part is branch else TextExpert)
        self.branch = branch
        self.experts = nn.ModuleList(e for expert in experts or []
                                     for e in expert.expand(self.fields, encoder.dim, encoder.layer_count))
        # the layer sets the representation experts read (batch["layer_embeddings"]; frozen encoders)
        self.layer_sets = tuple(sorted({k for e in self.experts for k in e.layer_sets}))
        if head_input not in ("embeddings", "expert_scores"):
            raise ValueError(f"model.net.head_input must be embeddings or expert_scores, got {head_input!r}")
        if head_input == "expert_scores" and not self.experts:
            raise ValueError("model.net.head_input=expert_scores needs model.net.experts")
        if self.experts and self.encoder is not None and any(e.needs_embeddings for e in self.experts):
            raise ValueError("an embedding ridge expert needs a frozen encoder (trainable_layers: 0); to fine-tune, "
                             "drop the experts (model.net.experts=[] model.net.head_input=embeddings, as "
                             "experiment=text_empathetic_exchanges_finetune does) or keep text experts only "
                             "(model.net.experts=[{_target_:empathic_fusion.models.text.experts.TfidfRidgeExpert}] "
                             "model.net.head_input=embeddings)")
        self.head_input = head_input
        text_dim = encoder.dim * len(self.fields) if head_input == "embeddings" else n_outputs * len(self.experts)
        in_dim = text_dim + (self.persona.out_dim if self.persona else 0) + (branch.out_dim if branch is not None else 0)
        self.head = (head or MLPHead)(in_dim, n_outputs)
        if self.experts:
            last = [m for m in self.head.modules() if isinstance(m, nn.Linear)][-1]
            nn.init.zeros_(last.weight)  # the head starts as "no correction" to the stacked experts
            nn.init.zeros_(last.bias)
        self.register_buffer("stack_weight", torch.zeros(n_outputs, len(self.experts)))
        self.register_buffer("stack_bias", torch.zeros(n_outputs))

    def expert_scores(self, batch: dict) -> torch.Tensor:
        """Each expert's predictions, N x outputs x experts (standardised target scale)."""
        return torch.stack([expert(batch) for expert in self.experts], dim=-1)

    def fit_experts(self, batch: dict, targets: np.ndarray, groups: list[str]) -> np.ndarray:
        """Fit every expert on the training rows in `batch` and the stack weights on their held-out
        predictions; returns those (N x outputs x experts), which the head trains on."""
        held_out, self.fit_seconds = [], []
        for expert in self.experts:
            start = time.perf_counter()
            held_out.append(np.asarray(expert.fit(batch, targets, groups)).reshape(len(targets), -1))
            self.fit_seconds.append(time.perf_counter() - start)
        held_out = np.stack(held_out, axis=-1)
        weight, bias = stack_weights(held_out, np.asarray(targets).reshape(len(targets), -1))
        self.stack_weight.copy_(torch.from_numpy(weight))
        self.stack_bias.copy_(torch.from_numpy(bias))
        return held_out.astype(np.float32)

    def _embeddings(self, batch: dict) -> torch.Tensor:
        if self.encoder is not None:
            return torch.cat([self.encoder(batch["texts"][f]) for f in self.fields], dim=-1)
        if "embeddings" in batch:
            return batch["embeddings"]
        raise ValueError("a net over a frozen encoder needs batch['embeddings'] (attach the encoder to the "
                         "datamodule: datamodule.embedder = module.frozen_encoder)")

    def forward(self, batch: dict) -> torch.Tensor:
        scores = None
        if self.experts:
            scores = batch["expert_scores"] if "expert_scores" in batch else self.expert_scores(batch)
        if self.head_input == "expert_scores":
            parts = [scores.flatten(1).float()]
        else:
            parts = [self._embeddings(batch)]
        if self.branch is not None:
            parts.append(self.branch(batch).to(parts[0].dtype))
        if self.persona is not None:
            parts.append(self.persona(batch["persona_ids"], batch["persona_numeric"]))
        out = self.head(torch.cat(parts, dim=-1))
        if scores is None:
            return out
        return out + (scores.to(out.dtype) * self.stack_weight).sum(-1) + self.stack_bias


@register_model("text", aliases=("empathic_fusion.text.model.TextEmpathyModule",))
class TextEmpathyModule(EmpathyLightningModule):
    """Train / validate / test / predict a text net; logs `{stage}/loss` and `{stage}/rating/{r,rho,mse}`
    of the overall score (the mean of the labels) so sweepers can optimise a validation metric.
    `data_info` is TextDataModule.fitted_state(); `baselines` and `robustness` configure the report."""

    collected_keys = ("pred", "target", "row")

    def __init__(self, net: dict[str, Any], optimizer: dict[str, Any], scheduler: dict[str, Any] | None,
                 data_info: dict[str, Any], run_config: dict[str, Any], encoder_lr: float, use_persona: bool,
                 baselines: dict[str, Any], robustness: dict[str, Any]):
        super().__init__(optimizer, scheduler, data_info, run_config)
        self.save_hyperparameters()
        self.label_names = list(data_info["labels"])
        self.levels = tuple(data_info["levels"]) if data_info["levels"] else None
        self.persona_encoder = PersonaEncoder.from_state(data_info["persona"])
        persona = use_persona and bool(self.persona_encoder.columns)
        net_cfg = dict(net)
        encoder: SentenceEncoder = hydra.utils.instantiate(net_cfg.pop("encoder"))
        if encoder.choice_note:  # `auto`: a checkpoint loads the encoder chosen here, wherever it is loaded
            self.hparams["net"] = {**net, "encoder": {**net["encoder"], "model_path": encoder.chosen_model_path}}
        self.net: TextRegressor = hydra.utils.instantiate(
            net_cfg, fields=list(data_info["fields"]), n_outputs=len(self.label_names), encoder=encoder,
            persona_cardinalities=self.persona_encoder.cardinalities if persona else None,
            persona_numeric=self.persona_encoder.n_numeric if persona else 0)
        self.__dict__["frozen_encoder"] = encoder if encoder.frozen else None  # not a submodule: no weights saved
        self.encoder_info = {"model_path": encoder.model_path, "identity": encoder.identity,
                             "trainable_layers": encoder.trainable_layers, "choice": encoder.choice_note}
        self.register_buffer("target_mean", torch.tensor(data_info["target_mean"], dtype=torch.float32))
        self.register_buffer("target_std", torch.tensor(data_info["target_std"], dtype=torch.float32))
        self.stack_report: dict[str, dict[str, float]] = {}

    @property
    def output_names(self) -> list[str]:
        """The scores the model gives: one per label, plus their mean (`overall`) when there are several."""
        names = list(self.label_names)
        return names + [OVERALL] if len(names) > 1 else names

    def data_config(self) -> dict[str, Any]:
        """The training run's data config (older checkpoints without one: their fields as text columns)."""
        info = self.hparams.data_info
        return dict((self.hparams.run_config or {}).get("data") or {
            "text_columns": list(info["fields"]), "label_columns": list(info["labels"]),
            "persona_columns": list(self.persona_encoder.columns), "levels": info.get("levels")})

    @property
    def encoder(self) -> SentenceEncoder:
        return self.frozen_encoder if self.frozen_encoder is not None else self.net.encoder

    def forward(self, batch: dict) -> torch.Tensor:
        """Scores on the label scale, N x labels."""
        return self.net(batch) * self.target_std + self.target_mean

    def setup(self, stage: str) -> None:
        """A frozen encoder encodes every text of the datamodule's table once (cached on disk when
        cache_dir is set); batches then carry the cached embeddings."""
        super().setup(stage)
        if self.trainer.datamodule is not None:
            attach_encoder(self, self.trainer.datamodule)

    def on_fit_start(self) -> None:
        """Fit an extra branch (TF-IDF, ...) on the training rows' texts, once (not again on resume), and
        the ridge experts with their stack weights (deterministic, so a resumed run refits the same)."""
        dm = self.trainer.datamodule
        branch = self.net.branch
        if branch is not None and not branch.fitted:
            branch.fit({f: [dm.fields[f][i] for i in dm.train_rows] for f in self.net.fields})
        if self.net.experts:
            self._fit_experts(dm)

    def _fit_experts(self, dm) -> None:
        rows = np.asarray(dm.train_rows)
        batch = dm.collate(rows)
        targets = (dm.targets[rows] - dm.target_mean) / dm.target_std
        held_out = self.net.fit_experts(batch, targets, dm.groups(rows))
        # Expert scores per row while fitting (not state: rebuilt at every fit start, dropped at its end):
        # training rows get the held-out predictions, never the fitted ones; validation rows the fitted
        # experts' scores, computed once here instead of every epoch (the experts do not change).
        lookup = torch.full((len(dm.table), *held_out.shape[1:]), float("nan"))
        lookup[torch.from_numpy(rows)] = torch.from_numpy(held_out)
        val_rows = np.asarray(dm.val_rows)
        if len(val_rows):
            with torch.no_grad():
                lookup[torch.from_numpy(val_rows)] = self.net.expert_scores(dm.collate(val_rows)).float().cpu()
        self.__dict__["_fit_scores"] = lookup
        z = targets.mean(1)
        self.stack_report = {
            e.label: {"weight": float(self.net.stack_weight[:, k].mean()), "alpha": e.alpha, "grid_end": e.grid_end,
                      "fit_seconds": round(self.net.fit_seconds[k], 2),
                      "held_out_r": metric_values(held_out[:, :, k].mean(1), z)["pearson"]}
            for k, e in enumerate(self.net.experts)}
        log.info("experts on %d training rows (held-out r, ridge alpha, stack weight): %s", len(rows),
                 "; ".join(f"{name} {v['held_out_r']:.3f}, {'-' if v['alpha'] is None else format(v['alpha'], 'g')}"
                           f"{GRID_END_NOTES[v['grid_end']] if v['grid_end'] else ''}, {v['weight']:.3f}"
                           for name, v in self.stack_report.items()))

    def _step(self, batch: dict, stage: str, batch_idx: int) -> torch.Tensor:
        z = self.net(batch)
        loss = nn.functional.mse_loss(z, (batch["target"] - self.target_mean) / self.target_std)
        if stage == "train":
            self.log_training_loss(loss, len(batch["target"]), batch_idx)
        else:
            self.log(f"{stage}/loss", loss, batch_size=len(batch["target"]), prog_bar=stage != "test", sync_dist=True)
        if stage != "train":
            self.collect(stage, pred=z.detach() * self.target_std + self.target_mean, target=batch["target"],
                         row=batch["row"])
        return loss

    def _with_fit_scores(self, batch: dict) -> dict:
        """The batch with its rows' expert scores from the fit-start lookup (see _fit_experts)."""
        scores = self._fit_scores[batch["row"].cpu()]
        if torch.isnan(scores).any():
            raise RuntimeError("a batch holds rows outside the training and validation rows the experts were set up for")
        return {**batch, "expert_scores": scores.to(self.device)}

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self._step(self._with_fit_scores(batch) if self.net.experts else batch, "train", batch_idx)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        fitting = self.net.experts and "_fit_scores" in self.__dict__  # validate() outside fit: scored afresh
        self._step(self._with_fit_scores(batch) if fitting else batch, "val", batch_idx)

    def on_fit_end(self) -> None:
        self.__dict__.pop("_fit_scores", None)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "test", batch_idx)

    def epoch_end(self, stage: str, outputs: dict[str, torch.Tensor]) -> None:
        pred, target, row = outputs["pred"], outputs["target"], outputs["row"].long()
        if self.trainer.world_size > 1:  # DDP: every rank's rows, once each (the sampler pads with repeats)
            order = np.unique(row.numpy(), return_index=True)[1]
            pred, target, row = pred[order], target[order], row[order]
        gathered = {"pred": pred.numpy(), "target": target.numpy(), "row": row.numpy()}
        if not self.trainer.sanity_checking:
            values = metric_values(gathered["pred"].mean(1), gathered["target"].mean(1))
            for name in ("pearson", "spearman", "mse"):
                self.log(f"{stage}/rating/{name}", float(values[name]), sync_dist=False)
        if stage == "test":
            self.test_predictions = gathered

    def describe(self) -> dict[str, Any]:
        """The text fields of the checkpoint header."""
        return {"encoder": self.encoder_info, "fields": list(self.net.fields),
                "labels": self.label_names, "stack": self.stack_report}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        header = checkpoint[HEADER_KEY]
        self.stack_report = header["stack"] or self.stack_report
        saved = header["encoder"]
        if saved["identity"] and saved["identity"] != self.encoder_info["identity"]:
            raise ValueError(f"the checkpoint was trained with encoder {saved['model_path']} (identity "
                             f"{saved['identity']}), but {self.encoder_info['model_path']} (identity "
                             f"{self.encoder_info['identity']}) was loaded: give model.net.encoder.model_path of "
                             "the training encoder")

    def parameter_groups(self) -> list:
        """The head (and persona, branch) at the optimizer's lr; fine-tuned encoder layers at `encoder_lr`."""
        encoder = self.net.encoder
        encoder_params = [p for p in encoder.parameters() if p.requires_grad] if encoder is not None else []
        other = [p for n, p in self.net.named_parameters() if p.requires_grad and not n.startswith("encoder.")]
        groups = [{"params": other}]
        if encoder_params:
            groups.append({"params": encoder_params, "lr": self.hparams.encoder_lr})
        return groups

    def evaluation_datamodule(self, data_overrides: dict[str, Any], features_overrides: dict[str, Any],
                              split: str, test_csv: str | None = None,
                              trainer: L.Trainer | None = None) -> TextDataModule:
        """The checkpoint's own fold (split=test), its validation rows (split=val) or every row of
        `test_csv` (same columns), with the checkpoint's persona vocabulary and target scaling."""
        data_cfg = {**self.run_config["data"], **data_overrides}
        if test_csv:
            data_cfg.update(path=str(test_csv), test_all=True, cv_fold=None, max_rows=None)
        datamodule = self.instantiate_datamodule(data_cfg, {**self.run_config["features"], **features_overrides})
        set_up(datamodule, trainer, "test")
        info = self.data_info  # the checkpoint's persona vocabulary and scaling, never refitted
        datamodule.apply_fitted(PersonaEncoder.from_state(info["persona"]), np.asarray(info["target_mean"]),
                                np.asarray(info["target_std"]))
        missing = [f for f in info["fields"] if f not in datamodule.fields]
        if missing:
            raise ValueError(f"the model reads fields {info['fields']}, the data ({data_cfg['path']}) has "
                             f"{list(datamodule.fields)}")
        if split == "val" and not test_csv:
            datamodule.test_rows = datamodule.val_rows
        return datamodule

    def group_attributes(self, datamodule: L.LightningDataModule) -> tuple[list[str], str]:
        return list(datamodule.table.columns), "the text table"


def attach_encoder(module: TextEmpathyModule, datamodule: TextDataModule) -> None:
    """Frozen encoder: encode every text of the table once (cached on disk when cache_dir is set), on the
    device the run trains on (without a Trainer, scoring: the module's). The frozen encoder is no submodule
    (its weights stay out of checkpoints), so Lightning never moves it, and `setup` runs before the module
    itself is moved: without this, a `trainer=gpu` run encoded its whole table on the CPU."""
    encoder = module.frozen_encoder
    datamodule.embedder = encoder
    datamodule.layer_sets = module.net.layer_sets
    module.encoder.check_languages(datamodule.fields)
    if encoder is not None:
        trainer = module._trainer
        encoder.to(trainer.strategy.root_device if trainer is not None else module.device)
        if module.net.layer_sets:
            encoder.keep_layers(max(module.net.layer_sets))  # from the same pass as the embeddings
        started = time.perf_counter()
        if encoded := encoder.warm(datamodule.all_texts()):
            log.info("frozen encoder on %s: %d texts embedded in %.1f s", encoder.device, encoded,
                     time.perf_counter() - started)
        encoder.save_cache()
