"""`model.step_graph=true`: the whole training step (the batch's gather, forward, loss, backward, AdamW) as one
function that a GPU captures as a CUDA graph. On the CPU it runs eagerly: it trains as the usual step does, and
it traces whole under torch.compile (fullgraph, aot_eager: no graph break, no host sync, one graph for every
step of the captured shape), which is what capture needs. The capture itself runs on a GPU (marked gpu)."""
from __future__ import annotations

import logging
import sys

import lightning as L
import pytest
import torch
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader

from empathic_fusion.models.step_graph import adamw_update, rate_on_device
from empathic_fusion.utils import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
from train_throughput import SyntheticBatches, fusion_module  # noqa: E402

DIMS = {"video": 12, "audio": 6, "text": 10, "story": 8, "traits": 6}
MODALITIES = ["video", "audio", "text"]
FUSION = ["tfn", "ef_lstm", "lf_lstm", "amer"]


def _module(name: str, step_graph: bool, **module_settings):
    torch.manual_seed(0)
    return fusion_module(name, MODALITIES, DIMS, module_overrides={"step_graph": step_graph, **module_settings})


def _fit(module, batches: list[dict], device: str = "cpu", **trainer_settings) -> L.Trainer:
    L.seed_everything(0)
    trainer = L.Trainer(accelerator="gpu" if device == "cuda" else "cpu", devices=1, logger=False,
                        limit_val_batches=0, num_sanity_val_steps=0, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, **trainer_settings)
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    return trainer


def _max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def _batches(full: int, size: int = 8, last: int = 0, device: str = "cpu") -> list[dict]:
    batches = SyntheticBatches(1, size, 10, DIMS, pool=full).batches
    if last:
        batches += SyntheticBatches(1, last, 10, DIMS, pool=1, seed=1).batches
    return [{k: ({kk: vv.to(device) for kk, vv in v.items()} if isinstance(v, dict) else v.to(device))
             for k, v in b.items()} for b in batches]


@pytest.mark.parametrize("name", FUSION)
def test_the_step_run_eagerly_trains_as_the_usual_step(name, caplog):
    """50 steps on one seed, dropout on: the same weights, running statistics and step count within 1e-6."""
    batches = _batches(5)
    usual, graphed = _module(name, False), _module(name, True)
    with caplog.at_level(logging.INFO):
        _fit(usual, batches, max_steps=50, max_epochs=-1)
        trainer = _fit(graphed, batches, max_steps=50, max_epochs=-1)
    assert not graphed.automatic_optimization and trainer.global_step == 50
    assert any("the step runs eagerly" in r.getMessage() for r in caplog.records)
    assert _max_difference(usual, graphed) <= 1e-6
    assert graphed.optimizers().optimizer.state_dict()["state"][0]["step"].item() == 50


@pytest.mark.parametrize("name", FUSION)
def test_the_step_traces_whole_with_no_recompile_over_epochs_that_end_in_a_partial_batch(name):
    """Dynamo traces the whole step (the LSTM's generic CPU kernels: oneDNN's LSTM has no traceable backward)
    as one graph (fullgraph: a break is an error); the partial batch runs eagerly, so two epochs make one graph
    (a recompile would make another), and it trains as the eager step. EF-LSTM's dropout between its LSTM
    layers is off here: the traced LSTM draws that mask in another order than the eager one."""
    batches = _batches(4, last=5)
    usual, graphed = _module(name, False), _module(name, True)
    for lstm in (m for module in (usual, graphed) for m in module.modules() if isinstance(m, torch.nn.LSTM)):
        lstm.dropout = 0.0
    graphed.step_compiler = lambda step: torch.compile(step, fullgraph=True, backend="aot_eager", dynamic=False)
    torch._dynamo.reset()  # no graph of another test's model in the cache
    counters.clear()
    with torch._dynamo.config.patch(allow_rnn=True, trace_autograd_ops=True, error_on_recompile=True), \
            torch.backends.mkldnn.flags(enabled=False):
        _fit(usual, batches, max_epochs=2)
        _fit(graphed, batches, max_epochs=2)
    assert counters["stats"]["unique_graphs"] == 1
    assert _max_difference(usual, graphed) <= 1e-6


@pytest.mark.parametrize("settings,reason", [
    ({"trainer": {"gradient_clip_val": 1.0}}, "gradient_clip_val"),
    ({"trainer": {"accumulate_grad_batches": 2}}, "accumulate_grad_batches"),
    ({"module": {"optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.01}}}, "torch.optim.SGD"),
    ({"module": {"compile": True, "compile_backend": "aot_eager"}}, "model.compile=true")])
def test_settings_that_rule_the_captured_step_out_train_the_usual_way_and_say_why(settings, reason, caplog):
    module = _module("lf_lstm", True, **settings.get("module", {}))
    with caplog.at_level(logging.INFO):
        trainer = _fit(module, _batches(2), max_steps=3, max_epochs=-1, **settings.get("trainer", {}))
    assert module.automatic_optimization and trainer.global_step == 3
    assert any("step graph off" in r.getMessage() and reason in r.getMessage() for r in caplog.records)


def test_the_update_is_adamws_with_the_rate_a_scheduler_writes_into_its_tensor():
    torch.manual_seed(0)
    reference_params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    params = [torch.nn.Parameter(p.detach().clone()) for p in reference_params]
    reference = torch.optim.AdamW(reference_params, lr=1e-3, weight_decay=0.01)
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    rate_on_device(optimizer)
    schedules = [torch.optim.lr_scheduler.StepLR(o, step_size=20, gamma=0.1) for o in (reference, optimizer)]
    for step in range(50):
        grads = [torch.randn_like(p) for p in params]
        for p, g in zip(reference_params, grads):
            p.grad = g
        reference.step()
        optimizer.step()  # what Lightning's manual optimization calls: nothing to do without gradients
        with torch.no_grad():
            adamw_update(optimizer, dict(zip(params, grads)))
        for schedule in schedules:
            schedule.step()
    assert isinstance(optimizer.param_groups[0]["lr"], torch.Tensor)
    assert optimizer.param_groups[0]["lr"].item() == pytest.approx(reference.param_groups[0]["lr"])
    for a, b in zip(reference_params, params):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_a_checkpoint_of_a_captured_run_resumes_the_usual_way(tmp_path):
    """The captured step's rate is a device tensor; the checkpoint keeps a number, as an eager AdamW expects."""
    module = _module("tfn", True)
    L.seed_everything(0)
    trainer = L.Trainer(accelerator="cpu", max_steps=4, max_epochs=-1, logger=False, limit_val_batches=0,
                        num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    trainer.fit(module, train_dataloaders=DataLoader(_batches(2), batch_size=None))
    path = tmp_path / "captured.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)["optimizer_states"][0]["param_groups"][0]["lr"]
    assert isinstance(saved, float)
    resumed = _module("tfn", False)
    trainer = _fit(resumed, _batches(2), max_steps=6, max_epochs=-1)
    assert trainer.global_step == 6


@pytest.mark.gpu
@pytest.mark.parametrize("name", FUSION)
def test_the_step_is_captured_on_the_gpu_and_trains_as_the_eager_step(name, caplog):
    """After the warm-up the step replays as one CUDA graph (the partial batch eagerly); the weights follow the
    eager step's within TF32/cuDNN tolerance."""
    batches = _batches(6, last=5, device="cuda")
    usual, graphed = _module(name, False), _module(name, True)
    with caplog.at_level(logging.INFO):
        _fit(usual, batches, device="cuda", max_epochs=2)
        _fit(graphed, batches, device="cuda", max_epochs=2)
    assert any("captured as one CUDA graph" in r.getMessage() for r in caplog.records)
    assert graphed.__dict__["_graphed_step"].graph is not None
    assert _max_difference(usual, graphed) <= 1e-3


@pytest.fixture(scope="module")
def synthetic_store(tmp_path_factory):
    """A dataset with a filled store in the real format (benchmarks/grid.py), 126 training windows."""
    from benchmarks.grid import write_synthetic

    root = tmp_path_factory.mktemp("synthetic")
    write_synthetic(root, 0.002, 10, {"face": 24, "audio": 8, "text": 384})
    return root / "dataset", root / "store"


def _store_run(store, tmp_path, step_graph: bool, compiled: bool = False):
    from empathic_fusion.pipeline import build_run
    from empathic_fusion.compose import compose_config

    run = tmp_path / f"graph{step_graph}{compiled}"
    cfg = compose_config(["trainer=cpu", "model=tfn", "modality=v+a+t", "data=empathic_stories",
                          f"data.dataset_dir={store[0]}", f"data.store_dir={store[1]}", "data.frames=memory",
                          "data.split_fractions=[0.6,0.2,0.2]", "data.batch_size=16", "data.extract_workers=1",
                          "logger=none", "test=false", "trainer.max_epochs=2", f"model.step_graph={step_graph}",
                          f"hydra.run.dir={run}"], run)
    L.seed_everything(0)
    datamodule, module, trainer = build_run(cfg)
    if compiled:
        module.step_compiler = lambda step: torch.compile(step, fullgraph=True, backend="aot_eager", dynamic=False)
    L.seed_everything(0)
    trainer.fit(module, datamodule=datamodule)
    return datamodule, module, trainer


def test_with_frames_in_memory_the_step_gathers_its_batch_itself(synthetic_store, tmp_path):
    """The train loader yields window positions and the step gathers them (on a GPU: inside the graph); training
    equals the usual loader's, epochs ending in a partial batch (batches of 16); the whole step, gather
    included, traces as one graph."""
    _, usual, _ = _store_run(synthetic_store, tmp_path, False)
    datamodule, graphed, trainer = _store_run(synthetic_store, tmp_path, True)
    batches = list(datamodule.train_dataloader())
    assert datamodule.gather_in_step and all(set(b) == {"window"} for b in batches)
    assert trainer.global_step == 2 * len(batches) and len(batches[-1]["window"]) < 16
    assert _max_difference(usual, graphed) <= 1e-6
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(allow_rnn=True, trace_autograd_ops=True, error_on_recompile=True), \
            torch.backends.mkldnn.flags(enabled=False):
        _, compiled, _ = _store_run(synthetic_store, tmp_path, True, compiled=True)
    assert counters["stats"]["unique_graphs"] == 1
    assert _max_difference(usual, compiled) <= 1e-5
