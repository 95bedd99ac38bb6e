"""A fine-tuned sentence encoder as one more expert in the text model's stack (empathic_fusion/models/text/experts.py).

Why: fine-tuning the encoder is the lever that measured strongest on self-rated essays, but an
encoder fine-tuned on the training rows predicts those rows far better than it predicts new ones,
so stack weights fitted on its in-sample predictions would trust it blindly. Like the ridge experts
it is cross-fitted: on each of `inner_folds` grouped folds of the training rows (GroupKFold, a
writer or conversation is never split) a fresh copy of the encoder and a linear head are fine-tuned
on the other folds and predict the held-out one; those held-out predictions are what the stack
weights and the head see. Then one more copy is fine-tuned on every training row and scores
validation, test and new texts. That costs `inner_folds + 1` fine-tunings per training run: a
recipe for a GPU (conf/model/text_finetune.yaml), not the CPU default. So that those fine-tunings cost
their steps and little more, a fit loads the base encoder once and starts each fine-tuning from its
weights kept in memory, tokenises each field's texts once (batches are drawn from those tensors) and
predicts the held-out rows in batches on the device, copied back once.

The net: the encoder (its top `trainable_layers` layers trained at `lr`, the rest frozen), each of
the `fields` pooled by the encoder's recipe (long texts as chunks), side by side, dropout, a linear
head (`head_lr`) with one output per label, MSE on the standardised targets; AdamW with linear
warmup and decay over `epochs` epochs; bf16 autocast on a GPU. The fitted state holds the trained
layers' weights, the head, the base encoder's identity and the held-out predictions with a key of
the rows and settings they came from, and travels in the checkpoint (a resumed run fitting the same
rows reuses them instead of fine-tuning again), so a
checkpoint scores new text without the training data; a different base encoder is refused.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from empathic_fusion.core.registry import register_model
from empathic_fusion.core.sentence_encoder import SentenceEncoder, Tokenized
from empathic_fusion.metrics import metric_values
from empathic_fusion.models.text.experts import grouped_folds
from empathic_fusion.models.text.fitted import FittedModule

log = logging.getLogger(__name__)


class _EncoderHead(nn.Module):
    """Encoder over each field, pooled vectors side by side -> dropout -> linear (one output per label)."""

    def __init__(self, encoder: SentenceEncoder, fields: list[str], n_outputs: int, dropout: float):
        super().__init__()
        self.encoder, self.fields = encoder, list(fields)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.dim * len(self.fields), n_outputs)

    def forward(self, tokens: dict[str, Tokenized], rows: np.ndarray) -> torch.Tensor:
        """Outputs for the texts `rows` of each field's tokenised texts (`tokenize`)."""
        pooled = torch.cat([self.encoder.forward_tokens(tokens[f], rows) for f in self.fields], dim=-1)
        return self.head(self.dropout(pooled.float()))

    def tokenize(self, texts: dict[str, list[str]]) -> dict[str, Tokenized]:
        """Each field's texts tokenised once, on the net's device (batches then need no tokenizer)."""
        return {f: self.encoder.tokenize(texts[f]).to(self.encoder.device) for f in self.fields}

    def trained_state(self) -> dict[str, torch.Tensor]:
        """The weights fine-tuning changes: the trainable encoder layers and the head (CPU copies)."""
        names = {n for n, p in self.named_parameters() if p.requires_grad}
        return {n: t.detach().cpu().clone() for n, t in self.state_dict().items() if n in names}


@dataclass
class _Table:
    """One fit's training rows, prepared once: the net (the base encoder loaded once, a head), the
    weights every fine-tuning starts from (CPU copies of the trainable ones before any fine-tuning; the
    frozen ones never change) and each field's texts tokenised."""

    net: _EncoderHead
    pristine: dict[str, torch.Tensor]
    tokens: dict[str, Tokenized]


@register_model("finetuned_encoder_expert", aliases=("empathic_fusion.text.finetuned_expert.FineTunedEncoderExpert",))
class FineTunedEncoderExpert(FittedModule):
    """A sentence encoder fine-tuned with a linear head, cross-fitted on grouped inner folds (see the
    module docstring). `fields`: the text fields it reads (None: every field of the data)."""

    needs_embeddings = False
    label = "fine-tuned encoder"
    alpha = None     # no ridge penalty (the stack report's columns)
    grid_end = None
    layer_sets: tuple[int, ...] = ()  # it tokenises the texts itself (models/contracts.py TextExpert)

    def __init__(self, model_path: str | None = None, trainable_layers: int = 6, fields: list[str] | None = None,
                 max_length: int = 128, epochs: int = 3, batch_size: int = 32, lr: float = 2.0e-5,
                 head_lr: float = 1.0e-3, weight_decay: float = 0.01, warmup: float = 0.1, dropout: float = 0.1,
                 inner_folds: int = 5, seed: int = 0):
        super().__init__()
        if int(trainable_layers) < 1:
            raise ValueError(f"FineTunedEncoderExpert trainable_layers={trainable_layers}: must be >= 1 (a frozen "
                             "encoder is the embedding ridge expert's job)")
        if int(epochs) < 1 or int(batch_size) < 1 or not 0 <= float(warmup) < 1:
            raise ValueError(f"FineTunedEncoderExpert: epochs={epochs} and batch_size={batch_size} must be >= 1, "
                             f"warmup={warmup} in [0, 1)")
        self.model_path, self.trainable_layers, self.max_length = model_path, int(trainable_layers), int(max_length)
        self.fields = list(fields) if fields else None
        self.epochs, self.batch_size, self.lr, self.head_lr = int(epochs), int(batch_size), float(lr), float(head_lr)
        self.weight_decay, self.warmup, self.dropout = float(weight_decay), float(warmup), float(dropout)
        self.inner_folds, self.seed = int(inner_folds), int(seed)
        self.register_buffer("_device_marker", torch.zeros(0), persistent=False)
        self.__dict__["_net"] = None  # the fitted net, built from the state on first use (not a submodule)

    def expand(self, fields: list[str], dim: int, encoder_layers: int | None = None) -> list["FineTunedEncoderExpert"]:
        """Itself, reading the given fields (or its own `fields`, which must be among them)."""
        if self.fields is None:
            self.fields = list(fields)
        missing = [f for f in self.fields if f not in fields]
        if missing:
            raise ValueError(f"FineTunedEncoderExpert fields={self.fields}: {missing} not among the data's text "
                             f"fields {list(fields)}")
        return [self]

    def _spec(self) -> dict[str, Any]:
        """What the net is built from: the base encoder, how many of its layers train, the window, the fields."""
        return {"model_path": self.model_path, "trainable_layers": self.trainable_layers,
                "max_length": self.max_length, "fields": list(self.fields)}

    def _new_net(self, n_outputs: int, spec: dict[str, Any]) -> _EncoderHead:
        """A fresh encoder and an untrained head as `spec` says (`_spec()`, or the one a fitted state records)."""
        encoder = SentenceEncoder(spec["model_path"], trainable_layers=spec["trainable_layers"],
                                  max_length=spec["max_length"], batch_size=self.batch_size, cache_dir=None)
        return _EncoderHead(encoder, spec["fields"], n_outputs, self.dropout).to(self._device_marker.device)

    def fit(self, batch: dict, targets: np.ndarray, groups: list[str] | np.ndarray) -> np.ndarray:
        """Fine-tune on the training rows in `batch`; returns their cross-fitted predictions (N x labels)."""
        targets = np.asarray(targets, dtype=np.float32).reshape(len(targets), -1)
        texts = {f: [t or "" for t in batch["texts"][f]] for f in self.fields}
        key = self._fit_key(texts, targets, groups)
        if self._state is not None and self._state.get("fit_key") == key:  # a resumed run: fitted on these rows
            log.info("fine-tuned encoder: already fitted on these training rows (resumed run); not fine-tuned again")
            return np.asarray(self._state["held_out"], dtype=np.float32)
        folds = grouped_folds(groups, self.inner_folds, type(self).__name__)
        table = self._table(texts, targets.shape[1])
        held_out = np.zeros_like(targets)
        for k, (train_rows, test_rows) in enumerate(folds):
            net = self._train(table, targets, train_rows, self.seed + k)
            held_out[test_rows] = self._predict(net, table.tokens, test_rows)
            log.info("fine-tuned encoder: inner fold %d of %d, held-out r %.3f", k + 1, len(folds),
                     metric_values(held_out[test_rows].mean(1), targets[test_rows].mean(1))["pearson"])
        net = self._train(table, targets, np.arange(len(targets)), self.seed + len(folds))
        self._state = {**self._spec(), "encoder_identity": net.encoder.identity, "n_outputs": targets.shape[1],
                       "weights": net.trained_state(), "fit_key": key, "held_out": held_out}
        self.__dict__["_net"] = net.eval()
        return held_out

    def _fit_key(self, texts: dict[str, list[str]], targets: np.ndarray, groups: list[str] | np.ndarray) -> str:
        """What a fit depends on: the rows (texts, targets, groups) and every setting."""
        digest = hashlib.sha1(json.dumps([texts, [str(g) for g in groups], self._settings()]).encode())
        digest.update(np.ascontiguousarray(targets).tobytes())
        return digest.hexdigest()

    def _settings(self) -> dict[str, Any]:
        return {**self._spec(), "epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr,
                "head_lr": self.head_lr, "weight_decay": self.weight_decay, "warmup": self.warmup,
                "dropout": self.dropout, "inner_folds": self.inner_folds, "seed": self.seed}

    def _table(self, texts: dict[str, list[str]], n_outputs: int) -> _Table:
        """The base encoder loaded once for the whole fit, its weights kept, each field tokenised once
        (the global random state left as it was: each fine-tuning seeds its own)."""
        device = self._device_marker.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            net = self._new_net(n_outputs, self._spec())
        return _Table(net, net.trained_state(), net.tokenize(texts))

    def _train(self, table: _Table, targets: np.ndarray, rows: np.ndarray, seed: int) -> _EncoderHead:
        """The table's net reset to the base encoder's weights and a fresh head, fine-tuned on `rows`
        (seeded: the same rows give the same net)."""
        device = self._device_marker.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            net = table.net
            net.load_state_dict(table.pristine, strict=False)
            net.head.reset_parameters()  # drawn from this fine-tuning's seed
            self._steps(net, table.tokens, targets, rows, seed)
        return net.eval()

    def _steps(self, net: _EncoderHead, tokens: dict[str, Tokenized], targets: np.ndarray, rows: np.ndarray,
               seed: int) -> None:
        """The fine-tuning's optimisation alone: AdamW with linear warmup and decay, `epochs` passes over
        `rows` in a seeded order (benchmarks/finetune_fixed_cost.py times it to tell a fit's fixed cost)."""
        device = self._device_marker.device
        net.train()
        encoder_params = [p for p in net.encoder.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW([{"params": encoder_params, "lr": self.lr},
                                       {"params": net.head.parameters(), "lr": self.head_lr}],
                                      weight_decay=self.weight_decay)
        steps = self.epochs * math.ceil(len(rows) / self.batch_size)
        warmup = int(self.warmup * steps)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: (step + 1) / warmup if step < warmup else max(0.0, (steps - step) / max(1, steps - warmup)))
        generator = np.random.default_rng(seed)
        y = torch.from_numpy(targets).to(device)
        for _ in range(self.epochs):
            order = rows[generator.permutation(len(rows))]
            for start in range(0, len(order), self.batch_size):
                chunk = order[start:start + self.batch_size]
                with _autocast(device):
                    pred = net(tokens, chunk)
                loss = nn.functional.mse_loss(pred.float(), y[torch.from_numpy(chunk).to(device)])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()

    def _predict(self, net: _EncoderHead, tokens: dict[str, Tokenized], rows: np.ndarray | None = None) -> np.ndarray:
        """Predictions for `rows` of the tokenised texts (None: every row), in batches of rows of similar
        token count (less padding), gathered on the device and copied back once."""
        device = self._device_marker.device
        rows = np.arange(len(tokens[net.fields[0]])) if rows is None else np.asarray(rows)
        length = sum(tokens[f].tokens()[rows] for f in net.fields)
        order = np.argsort(length, kind="stable")
        out = torch.zeros(len(rows), net.head.out_features, dtype=torch.float32, device=device)
        net.eval()
        with torch.no_grad():
            for start in range(0, len(rows), self.batch_size * 2):
                chunk = order[start:start + self.batch_size * 2]
                with _autocast(device):
                    out[torch.from_numpy(chunk).to(device)] = net(tokens, rows[chunk]).float()
        return out.cpu().numpy()

    def _fitted_net(self) -> _EncoderHead:
        """The fitted net: kept from fit, or rebuilt from the base encoder and the state's weights.

        Built and moved outside inference mode, also when first used inside `trainer.test`: a net
        made there would hold inference tensors, which no later `.to()` or training step outside that
        mode may touch (the module outlives the test: its report, a GPU run's move back to the CPU)."""
        with torch.inference_mode(False):
            return self._fitted_net_on_device()

    def _fitted_net_on_device(self) -> _EncoderHead:
        net = self.__dict__["_net"]
        if net is None:
            state = self._state
            net = self._new_net(int(state["n_outputs"]), state)
            if net.encoder.identity != state["encoder_identity"]:
                raise ValueError(f"the fine-tuned encoder expert was trained on base encoder {state['model_path']} "
                                 f"(identity {state['encoder_identity']}), but the folder there now has identity "
                                 f"{net.encoder.identity}: restore the training encoder's folder")
            missing = net.load_state_dict(state["weights"], strict=False)
            if missing.unexpected_keys:
                raise ValueError(f"fine-tuned encoder expert: unexpected weights {missing.unexpected_keys[:3]}")
            self.__dict__["_net"] = net.eval()
        return net.to(self._device_marker.device)

    def forward(self, batch: dict) -> torch.Tensor:
        if self._state is None:
            raise RuntimeError("FineTunedEncoderExpert used before fit (the module fits it at the start of training)")
        texts = {f: [t or "" for t in batch["texts"][f]] for f in self._state["fields"]}
        net = self._fitted_net()
        return self._as_batch_tensor(self._predict(net, net.tokenize(texts)), batch)

    def set_extra_state(self, state: dict[str, Any] | None) -> None:
        super().set_extra_state(state)
        self.__dict__["_net"] = None  # rebuilt from these weights on first use
        if state is not None:
            self.fields = list(state["fields"])


def _autocast(device: torch.device):
    """bf16 autocast on a GPU that supports it; nothing on a CPU (fp32 there)."""
    enabled = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)

