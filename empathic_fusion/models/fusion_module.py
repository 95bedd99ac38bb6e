"""The LightningModule of every fusion model: net (encoders + fusion) -> Z -> head -> score.

Training recipe defaults follow Appendix B of Shen, Kim et al. 2024 (EmpathicStories++): AdamW lr
1e-4, StepLR every 5 epochs by 0.1 (conf/optimizer/adamw.yaml, conf/scheduler/step_lr.yaml), MSE.
Metrics are logged per stage as `{stage}/window/{metric}` and `{stage}/rating/{metric}`, MSE and MAE on
the rating scale (`{stage}/loss` is the MSE on the cosine scale the model trains on); Acc/F1
binarise at `evaluation.threshold_rating` of the run config (null: the midpoint of the rating scale).
The rating scale is the training data's (dataset.yaml `rating_scale`, recorded as `data_info["scale"]`;
1-5 for checkpoints from before datasets declared one): targets are ratings mapped onto [-1, 1], and
reports, `empathic-predict` and the app map predictions back onto that scale.
Parameter-free baselines (`mean`, `story_similarity`) run through the same flow: a net may name
the head it needs (`required_head`), a head may be fitted in closed form at the start of fit
(`fit`, given the training-split mean), and with nothing to train no optimizer step is taken.

Checkpoints describe themselves (models/base.py; read with models/checkpoints.py's `read_header`): besides the shared header,
the modality set, the input dims per modality, the feature config and the feature-store manifest
hash. Running a model on features with other dims stops with a message saying which and how to
fix it, instead of a shape error deep inside an encoder.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any

import hydra
import lightning as L
import torch
import torch.nn.functional as F

from empathic_fusion.config.evaluation import threshold_rating_on
from empathic_fusion.core.errors import UserError
from empathic_fusion.core.files import canonical_hash
from empathic_fusion.core.registry import register_model
from empathic_fusion.datamodules.missing import modality_dropout
from empathic_fusion.datamodules.protocol import FusionData, GathersInStep
from empathic_fusion.models.contracts import FusionNet, check_part
from empathic_fusion.dataset import DatasetError, EmpathyDataset, Problem
from empathic_fusion.dataset.scale import recorded_scale
from empathic_fusion.metrics import empathy_metrics, split_predictions
from empathic_fusion.models.base import EmpathyLightningModule
from empathic_fusion.models.components.heads import make_head
from empathic_fusion.models.step_graph import GraphedStep, rate_on_device, refusal

log = logging.getLogger(__name__)

PROVENANCE = ("feature_manifest_hash", "split_hash", "window_frames", "dataset")  # from the datamodule, when given
STATS_KEY = "empathic_fusion_normalization"  # training-split mean/std per modality, to score new clips
VAL_PREDICTIONS_KEY = "empathic_fusion_validation_predictions"  # the validation split's, by the checkpoint's weights
DROPOUT_STATE_KEY = "empathic_fusion_modality_dropout_state"  # modality dropout's generator: a resumed run goes on
FULL_PRECISION = ("32-true", "64-true")  # validation predictions made at these equal the report's own pass


class FeatureMismatchError(UserError, ValueError):
    """The data's features do not have the dims (or modalities) a checkpoint was trained on."""


def _mismatch_message(description: dict[str, Any], problems: list[str]) -> str:
    features = description["features"]
    return ("the model was trained on other features than these: " + "; ".join(problems)
            + f". It expects modalities {description['modalities']} with dims {description['input_dims']}"
            + (f" (feature config {features})" if features else "")
            + ". Extract the features with the checkpoint's feature config (evaluate.py does so unless "
              "features.* are overridden) or retrain on these features.")


@register_model("fusion", aliases=("empathic_fusion.models.empathy_module.EmpathyModule",))
class FusionModule(EmpathyLightningModule):
    """`net` and `head` from the model config; modalities and input dims from the datamodule
    (`data_info`: FusionDataModule.fitted_state()); `needs`: modalities the net cannot run without;
    `modality_dropout`: training-time probability of masking a whole modality of a window
    (datamodules/missing.py), drawn from the module's own generator, seeded from torch's seed at fit."""

    collected_keys = ("pred", "target", "rating")

    def __init__(self, net: dict[str, Any], head: str, optimizer: dict[str, Any], scheduler: dict[str, Any] | None,
                 data_info: dict[str, Any], run_config: dict[str, Any], needs: list[str] | None = None,
                 modality_dropout: float = 0.0, compile: bool = False, compile_mode: str | None = None,
                 compile_backend: str = "inductor", step_graph: bool = False):
        super().__init__(optimizer, scheduler, data_info, run_config)
        self.save_hyperparameters()
        self.modalities = list(data_info["modalities"])
        self.input_dims = {k: int(v) for k, v in dict(data_info["input_dims"]).items()}
        lacking = sorted(set(needs or []) - set(self.modalities))
        if lacking:
            raise ValueError(f"{str(net['_target_']).rsplit('.', 1)[-1]} needs modalities {lacking}; the data has "
                             f"{self.modalities} (pick a modality that includes them, e.g. modality=t)")
        self.net = hydra.utils.instantiate(net, modalities=list(self.modalities), input_dims=dict(self.input_dims),
                                           _convert_="all")
        check_part(self.net, FusionNet, "; `required_head = None` lets the model config choose the head")
        required = self.net.required_head or head
        if head != required:
            raise ValueError(f"{type(self.net).__name__} works only with head={required}, got head={head}")
        self.head = make_head(head, self.net.out_dim, int(self.input_dims["story"]))
        self.rating_scale = recorded_scale(data_info)  # the training data's; 1-5 in checkpoints that predate it
        self.threshold = float(self.rating_scale.to_target(self.threshold_rating(run_config["evaluation"])))
        self.normalization: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._validated: tuple[int, dict[str, torch.Tensor]] | None = None  # (global step, the last validation's)
        self.saved_val_predictions: dict[str, Any] | None = None  # what the loaded checkpoint holds
        self.modality_dropout = float(modality_dropout) if len(self.modalities) > 1 else 0.0
        if modality_dropout and len(self.modalities) < 2:
            warnings.warn(f"model.modality_dropout={modality_dropout} with the one modality {self.modalities}: "
                          "nothing can be dropped, training without modality dropout", stacklevel=2)
        self.dropout_generator: torch.Generator | None = None
        self._saved_dropout_state: torch.Tensor | None = None  # a resumed checkpoint's, taken at the training start
        self.compile_settings = {"mode": compile_mode, "backend": compile_backend} if compile else None
        self.__dict__["_compiled"] = None  # the compiled scorer, made on first use (not a submodule: same state dict)
        self.step_graph = bool(step_graph)  # the whole training step as one CUDA graph (models/step_graph.py)
        self.__dict__["_graphed_step"] = None  # made at the first captured step
        self.__dict__["_gather"] = None  # the datamodule's gather, when its train loader yields window positions
        self.step_compiler = None  # a torch.compile for the captured step's function instead (the CPU's trace check)

    def threshold_rating(self, evaluation: dict[str, Any]) -> float:
        """The Acc/F1 threshold of `evaluation` settings as a rating on the training data's scale (its
        midpoint when `threshold_rating` is null); ConfigError when it is off that scale."""
        return threshold_rating_on(self.rating_scale, evaluation.get("threshold_rating"),
                                   "the rating scale of the data the model was trained on")

    def check_rating_scale(self, dataset: EmpathyDataset) -> None:
        """Refuse a dataset whose ratings are on another scale than the model's: its predictions (mapped onto
        the training scale) and these ratings could not be compared."""
        if dataset.rating_scale == self.rating_scale:
            return
        declared = f"rating_scale is {dataset.rating_scale}"
        raise DatasetError(dataset.root, [Problem(
            "dataset.yaml", None, "rating_scale",
            f"{declared} but the model was trained on ratings on {self.rating_scale}, so its predictions and these "
            f"ratings are on different scales; declare rating_scale: [{self.rating_scale.low:g}, "
            f"{self.rating_scale.high:g}] if the ratings are on that scale, or use a model trained on "
            f"{dataset.rating_scale}")])

    def describe(self) -> dict[str, Any]:
        """The fusion fields of the checkpoint header."""
        provenance = {k: self.data_info[k] for k in PROVENANCE if k in self.data_info}
        return {"modalities": list(self.modalities), "input_dims": dict(self.input_dims),
                "features": self.run_config["features"], **provenance,
                "head": self.hparams.head}

    def check_input_dims(self, input_dims: dict[str, int], modalities: list[str] | None = None) -> None:
        """Raise FeatureMismatchError when data of these dims (and modalities) cannot feed this model."""
        expected = self.input_dims
        problems = []
        if modalities is not None and set(modalities) != set(self.modalities):
            problems.append(f"modalities {sorted(modalities)} instead of {sorted(self.modalities)}")
        for name in [*self.modalities, "story"]:
            if name in input_dims and int(input_dims[name]) != int(expected[name]):
                problems.append(f"{name} has {int(input_dims[name])} dims instead of {int(expected[name])}")
        if problems:
            raise FeatureMismatchError(_mismatch_message(self.describe(), problems))

    def _check_batch(self, batch: dict) -> None:
        dims = {m: batch[m]["x"].shape[-1] for m in self.modalities if isinstance(batch.get(m), dict)}
        if "story" in batch:
            dims["story"] = batch["story"].shape[-1]
        self.check_input_dims(dims)

    def forward(self, batch: dict) -> torch.Tensor:
        """Predicted empathy on the cosine scale, one value per window."""
        self._check_batch(batch)
        if self.compile_settings is None:
            return self.scores(batch)
        return self._compiled_scores(batch["story"].device)(batch)

    def scores(self, batch: dict) -> torch.Tensor:
        """The net and the head: what `model.compile=true` compiles."""
        return self.head(self.net(batch), batch["story"])

    def _compiled_scores(self, device: torch.device):
        """`scores` through torch.compile (one graph per batch shape: a split's full batches and its last one).
        On a GPU the default mode is reduce-overhead: CUDA graphs, replayed with one launch instead of one per
        kernel; nn.LSTM is not traced by Dynamo and runs as it is between the compiled parts."""
        compiled = self.__dict__["_compiled"]
        if compiled is None:
            settings = self.compile_settings
            mode = settings["mode"] or ("reduce-overhead" if device.type == "cuda" else "default")
            compiled = self.__dict__["_compiled"] = torch.compile(self.scores, mode=mode, dynamic=False,
                                                                  backend=settings["backend"])
            self.__dict__["_cuda_graphs"] = mode == "reduce-overhead" and device.type == "cuda"
        if self.__dict__.get("_cuda_graphs"):
            torch.compiler.cudagraph_mark_step_begin()  # outputs of the last replay may be overwritten from here
        return compiled

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit" and self.step_graph:
            self._choose_step_graph()
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if not isinstance(datamodule, FusionData):  # a module used outside a trainer, or a datamodule of one's own
            return
        # fail before the first batch: the datamodule knows its dims
        self.check_input_dims(datamodule.input_dims, datamodule.modalities)
        if datamodule.stats:  # kept with the weights: a new clip (serve.py) is z-scored like the training split
            self.normalization = {m: (torch.as_tensor(mean), torch.as_tensor(std))
                                  for m, (mean, std) in datamodule.stats.items()}

    def _choose_step_graph(self) -> None:
        """Train with the captured step (manual optimization) unless the run's settings rule it out."""
        reason = refusal(self._trainer, self.optimizer_cfg, self.scheduler_cfg, self.compile_settings is not None)
        if reason is not None:
            log.info("step graph off: %s; the training step runs as usual", reason)
        self.automatic_optimization = reason is not None
        datamodule = self.trainer.datamodule if reason is None else None
        if isinstance(datamodule, GathersInStep):  # the gather of each batch becomes part of the captured step
            self.__dict__["_gather"] = datamodule.gather_training_batches_in_step()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.normalization:
            checkpoint[STATS_KEY] = self.normalization
        if (self._validated is not None and self._validated[0] == checkpoint.get("global_step")
                and self.trainer.world_size == 1):  # the weights saved are those that made the last validation's
            checkpoint[VAL_PREDICTIONS_KEY] = {"data": canonical_hash(self.data_description),
                                               "precision": str(self.trainer.precision), **self._validated[1]}
        if self.dropout_generator is not None:
            checkpoint[DROPOUT_STATE_KEY] = self.dropout_generator.get_state()
        for state in checkpoint.get("optimizer_states", []):  # a captured step's rate is a device tensor
            for group in state.get("param_groups", []):
                if isinstance(group.get("lr"), torch.Tensor):
                    group["lr"] = float(group["lr"])

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.normalization = dict(checkpoint.get(STATS_KEY) or {})
        self.saved_val_predictions = checkpoint.get(VAL_PREDICTIONS_KEY)
        self._saved_dropout_state = checkpoint.get(DROPOUT_STATE_KEY)

    def validation_predictions(self, datamodule: FusionData) -> dict[str, torch.Tensor] | None:
        """The validation split's predictions saved with the loaded checkpoint by its own weights, when they were
        made on this datamodule's data in full precision (then equal to a pass over the split, which the report
        needs no more); else None."""
        saved = self.saved_val_predictions
        if (saved is None or saved["precision"] not in FULL_PRECISION
                or saved["data"] != canonical_hash(datamodule.describe())):
            return None
        return split_predictions(saved["window_pred"], saved["window_target"], saved["window_rating"])

    def _step(self, batch: dict, stage: str, batch_idx: int) -> torch.Tensor:
        pred = self(batch)
        loss = F.mse_loss(pred, batch["target"])
        if stage == "train":
            self.log_training_loss(loss, len(pred), batch_idx)
        else:
            self.log(f"{stage}/loss", loss, on_epoch=True, prog_bar=True, batch_size=len(pred))
        kept = pred.detach().clone() if self.compile_settings else pred  # a CUDA graph's next replay reuses its output
        self.collect(stage, pred=kept, target=batch["target"], rating=batch["rating_index"])
        return loss

    def on_fit_start(self) -> None:
        if self.head.closed_form:  # the constant baseline's head: set from the training split
            try:  # FusionData's train_target_mean (a datamodule of one's own may give only that)
                mean = float(self.trainer.datamodule.train_target_mean)
            except (AttributeError, TypeError):  # no datamodule, none with it, or it is None
                raise RuntimeError(f"head '{self.hparams.head}' is set from the datamodule's train_target_mean; "
                                   "fit with a datamodule that has it (datamodules/protocol.py FusionData)") from None
            self.head.fit(mean)

    def on_train_start(self) -> None:
        if self.modality_dropout:  # its own stream: the global one (shuffling, dropout) draws as without it
            self.dropout_generator = torch.Generator().manual_seed(torch.initial_seed() + self.global_rank)
            if self._saved_dropout_state is not None:  # resumed: where the interrupted run's stream was
                self.dropout_generator.set_state(self._saved_dropout_state)
                self._saved_dropout_state = None

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor | None:
        if not self.automatic_optimization:
            self._captured_training_step(batch, batch_idx)
            return None
        if self.modality_dropout and self.training:
            if self.dropout_generator is None:  # a step outside trainer.fit
                self.on_train_start()
            batch = modality_dropout(batch, self.modalities, self.modality_dropout, self.dropout_generator)
        loss = self._step(batch, "train", batch_idx)
        return loss if loss.requires_grad else None  # None: nothing to train, Lightning skips the step

    def _step_body(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """What the captured step computes before its gradients: the batch's gather when the loader gave its
        window positions only, modality dropout (drawn on the batch's device from its generator, or from the
        module's own stream on the CPU), the scores and the loss."""
        if "window" in batch:
            batch = self.__dict__["_gather"](batch["window"])
        if self.modality_dropout:
            device = batch["target"].device
            generator = self.dropout_generator if device.type == "cpu" else None
            batch = modality_dropout(batch, self.modalities, self.modality_dropout, generator, device=device)
        pred = self.scores(batch)
        return F.mse_loss(pred, batch["target"]), {"pred": pred, "target": batch["target"],
                                                   "rating": batch["rating_index"]}

    def _captured_training_step(self, batch: dict, batch_idx: int) -> None:
        """One training step through `GraphedStep`, run by the optimizer's step as Lightning's manual optimization
        expects (its step count and hooks); the optimizer's own update then finds no gradient to apply."""
        if "window" not in batch:
            self._check_batch(batch)
        optimizer = self.optimizers()
        step = self.__dict__["_graphed_step"]
        if step is None:
            if self.modality_dropout and self.dropout_generator is None:
                self.on_train_start()
            rate_on_device(optimizer.optimizer)
            step = self.__dict__["_graphed_step"] = GraphedStep(
                self._step_body, optimizer.optimizer, self.loss_sums(self.device), compiler=self.step_compiler)
        out: dict[str, torch.Tensor] = {}

        def closure() -> None:
            out.update(step(batch))
            self.count_training_loss(len(out["pred"]), batch_idx)
        optimizer.step(closure=closure)
        self.collect("train", **out)
        self._step_scheduler("step")

    def _step_scheduler(self, ended: str) -> None:
        """At the end of a training "step" or "epoch" (`ended`), a scheduler step when the scheduler's interval is
        that and `frequency` of them are done (Lightning steps schedulers itself only when it steps the optimizer
        itself)."""
        if not self.scheduler_cfg or self.scheduler_cfg.get("interval", "epoch") != ended:
            return
        scheduler = self.lr_schedulers()
        done = self.trainer.current_epoch + 1 if ended == "epoch" else self.trainer.global_step
        if scheduler is not None and done % int(self.scheduler_cfg.get("frequency", 1)) == 0:
            scheduler.step()

    def on_train_epoch_end(self) -> None:
        super().on_train_epoch_end()
        if not self.automatic_optimization:
            self._step_scheduler("epoch")

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "val", batch_idx)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "test", batch_idx)

    def epoch_end(self, stage: str, outputs: dict[str, torch.Tensor]) -> None:
        pred, target, rating = outputs["pred"], outputs["target"], outputs["rating"].long()
        if not torch.isfinite(pred).all():  # NaN kept (nan_strategy="disable"): say so instead of failing later
            bad = int((~torch.isfinite(pred)).sum())
            raise FloatingPointError(f"{stage}: {bad} of {len(pred)} window predictions are NaN/Inf. The inputs or "
                                     "the weights hold non-finite values: run `python extract.py verify=true` to "
                                     "check the feature store, or lower the learning rate")
        predictions = split_predictions(pred, target, rating)
        half_range = self.rating_scale.half_range  # MSE and MAE on the rating scale; `{stage}/loss` is the model's
        levels = {level: empathy_metrics(predictions[f"{level}_pred"], predictions[f"{level}_target"], self.threshold,
                                         half_range=half_range) for level in ("window", "rating")}
        self.results[stage] = levels
        for level, values in levels.items():
            self.log_dict({f"{stage}/{level}/{k}": v for k, v in values.items()}, prog_bar=False)
        if stage == "val" and not self.trainer.sanity_checking:
            self._validated = (self.trainer.global_step, {"window_pred": pred, "window_target": target,
                                                          "window_rating": rating})
        if stage == "test":
            self.test_predictions = predictions

    def evaluation_datamodule(self, data_overrides: dict[str, Any], features_overrides: dict[str, Any],
                              split: str, test_csv: str | None = None,
                              trainer: L.Trainer | None = None) -> L.LightningDataModule:
        datamodule = super().evaluation_datamodule(data_overrides, features_overrides, split, test_csv, trainer)
        self.check_rating_scale(datamodule.dataset)
        if split == "val":
            datamodule.datasets["test"] = datamodule.datasets["val"]
        return datamodule

    def group_attributes(self, datamodule: L.LightningDataModule) -> tuple[list[str], str]:
        return list(datamodule.dataset.participants.columns), "participants.csv"
