"""The training loop in-process: schedule, timing, files written, divergence."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch

from normlab.compose import to_train_config
from normlab.config import OptimConfig, RunOptions
from normlab.training.loop import train
from normlab.training.metrics import NAMES
from normlab.training.step import lr_at
from normlab.training.tracking import StepTimer

from ..conftest import TINY, run_cli


def test_an_offline_wandb_run_prints_no_summary_of_its_own(cfg_tiny, tmp_path, capfd, monkeypatch):
    """wandb's finish printed its run history and summary tables (about 30 lines) after the
    run, so the command's result line was not the last one; normlab's wandb runs are quiet."""
    from normlab.training.loop import train

    monkeypatch.delenv("WANDB_SILENT", raising=False)  # the test session's: wandb as users run it
    summary = train(cfg_tiny("logger=wandb", "logger.mode=offline", "max_steps=2"), tmp_path)
    assert summary["status"] == "completed" and list((tmp_path / "wandb").glob("offline-run-*"))
    printed = "".join(capfd.readouterr())
    assert "Run summary" not in printed and "Run history" not in printed, printed[-1500:]


def test_lr_warms_up_linearly_then_decays_by_cosine_to_min_lr():
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10)
    assert lr_at(0, 110, cfg) == pytest.approx(0.1)
    assert lr_at(9, 110, cfg) == pytest.approx(1.0)
    assert lr_at(60, 110, cfg) == pytest.approx(0.1 + 0.5 * 0.9)  # half-way: cos(pi/2) = 0
    assert lr_at(110, 110, cfg) == pytest.approx(0.1)
    assert lr_at(50, 110, OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10, decay=False)) == 1.0


def test_step_timer_leaves_warmup_steps_out_of_its_summary():
    timer = StepTimer(torch.device("cpu"), warmup_steps=2)
    timer.times_ms = [1000.0, 900.0, 10.0, 20.0, 30.0, 40.0]
    s = timer.summary(tokens_per_step=1000, flops_per_step=1e9, peak_tflops=1.0)
    assert s["step_time_ms_median"] == pytest.approx(25.0)
    assert s["step_time_ms_p90"] == pytest.approx(37.0)
    assert s["tokens_per_s"] == pytest.approx(1000 / 0.025)
    assert s["mfu"] == pytest.approx(1e9 / 0.025 / 1e12)


def test_a_tiny_run_writes_metrics_and_summary(compose_cfg, tmp_path):
    cfg = to_train_config(compose_cfg([*TINY, "norm=rms", "norm.impl=reference"]))
    summary = train(cfg, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5, 6]  # step 0: the initial model
    assert set(NAMES.values()) == {  # the namespaced names, written once in metrics.py
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/spikes",
        "perf/step_time_ms",
        "perf/tokens_per_s",
        "perf/train_time_s",
        "val/loss",
        "val/bpb",
    }
    for key in set(NAMES.values()) - {"val/loss", "val/bpb"}:
        assert all(math.isfinite(r[key]) for r in rows[1:]), key
    # step 0 is the evaluation before the first step: val keys and a training time of 0 only
    assert set(rows[0]) == {"step", "val/loss", "val/bpb", "perf/train_time_s"}
    assert rows[0]["perf/train_time_s"] == 0.0
    assert rows[0]["val/loss"] == pytest.approx(math.log(256), abs=0.3)  # an untrained model
    assert [r["step"] for r in rows if "val/loss" in r] == [0, 3, 6]
    # byte tokens: one byte per token, so bits per byte are nats per token / ln 2 exactly
    assert all(r["val/bpb"] == r["val/loss"] / math.log(2) for r in rows if "val/loss" in r)
    # the training clock: the cumulative step times (ms -> s), up to and including each step
    times = [r["perf/train_time_s"] for r in rows]
    assert times == sorted(times) and times[-1] == pytest.approx(summary["train_time_s"])
    for a, b in zip(rows[1:], rows[2:], strict=False):
        delta = b["perf/train_time_s"] - a["perf/train_time_s"]
        assert delta == pytest.approx(b["perf/step_time_ms"] / 1e3)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert summary["status"] == "completed" and summary["steps_completed"] == 6
    assert summary["steps_done"] == 6 and summary["stopped_by"] == "max_steps"
    assert summary["final_val_loss"] == rows[-1]["val/loss"]
    # the host CPU's model name and core count, from /proc/cpuinfo, beside the versions
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(x.split(":", 1)[1].strip() for x in cpuinfo.splitlines() if "model name" in x)
    assert summary["versions"]["cpu_model"] == f"{model} ({os.cpu_count()} cores)"
    assert summary["final_val_bpb"] == rows[-1]["val/bpb"] and summary["final_eval"] == {}
    assert summary["tokens_per_step"] == 4 * 32 and summary["max_time_s"] is None
    assert summary["norm_impl"] == "reference" and summary["norm"]["eps"] == 1e-5
    assert summary["init_seed"] == summary["data_seed"] == summary["seed"]  # null: the seed
    assert (
        summary["params"] > 0 and summary["step_time_ms_p90"] >= summary["step_time_ms_median"] > 0
    )
    assert len(summary["step_times_ms"]) == 5  # 6 steps minus 1 warm-up step
    assert summary["config"]["norm"]["kind"] == "rms"
    # the stability record: no spike in 6 steps (never judged: no full window), the largest
    # pre-clip gradient norm of the logged ones
    assert summary["loss_spikes"] == 0 and summary["loss_spike_steps"] == []
    assert summary["max_grad_norm"] == max(r["train/grad_norm"] for r in rows[1:])
    assert all(r["train/spikes"] == 0 for r in rows[1:])


def test_gradient_accumulation_consumes_every_micro_batch(compose_cfg, tmp_path):
    cfg = to_train_config(compose_cfg([*TINY, "optim.grad_accum=3", "max_steps=2"]))
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed"
    assert summary["tokens_per_s"] == pytest.approx(
        4 * 3 * 32 / (summary["step_time_ms_median"] / 1e3)
    )


def test_bf16_autocast_run_trains_on_cpu(compose_cfg, tmp_path):
    summary = train(to_train_config(compose_cfg([*TINY, "precision=bf16"])), tmp_path)
    assert summary["status"] == "completed" and math.isfinite(summary["final_val_loss"])


def test_a_non_finite_loss_ends_the_run_as_diverged_with_the_last_finite_loss(
    compose_cfg, tmp_path
):
    cfg = to_train_config(
        compose_cfg(
            [
                *TINY,
                "logger=none",
                "optim.lr=1e30",
                "optim.min_lr=0",
                "optim.warmup_steps=0",
                "optim.grad_clip=0",
            ]
        )
    )
    summary = train(cfg, tmp_path)
    assert summary["status"] == "diverged"
    assert 1 < summary["diverged_at_step"] <= 6
    assert math.isfinite(summary["last_finite_loss"]) and summary["final_val_loss"] is None


def test_an_unknown_optimizer_is_refused_with_the_allowed_names(tmp_path):
    from normlab.config import ConfigError

    with pytest.raises(ConfigError, match=r"optim\.name='lion' is not allowed: allowed: adamw$"):
        OptimConfig(name="lion")
    r = run_cli([*TINY, "optim.name=lion"], cwd=tmp_path)  # through the real CLI
    assert r.returncode == 2 and not list(tmp_path.rglob("metrics.jsonl")), "nothing trained"
    assert r.stderr == "normlab: error: optim.name=lion is not allowed (allowed: adamw)\n"


def _tiny(compose_cfg, *overrides):
    return to_train_config(compose_cfg([*TINY, *overrides]))


def test_the_host_reads_metrics_once_per_log_interval(compose_cfg, tmp_path, monkeypatch):
    """Every read of a tensor's value by normlab code (item, tolist, float, int, bool) is counted
    with the step it happened in: none inside a log_interval window, one at its end, one more for
    an evaluation. (torch's own CPU-side reads, e.g. of step counters, are not normlab's.)"""
    import sys

    from normlab.training import step as training_step

    here = {"step": 0}
    syncs: list[int] = []
    real_step = training_step.train_step

    def step_and_note(run, step, lr, *args, **kwargs):
        here["step"] = step + 1
        return real_step(run, step, lr, *args, **kwargs)

    def counting(name):
        real = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            if "/normlab/" in sys._getframe(1).f_code.co_filename.replace("\\", "/"):
                syncs.append(here["step"])
            return real(self, *args, **kwargs)

        return read

    monkeypatch.setattr(training_step, "train_step", step_and_note)
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    cfg = _tiny(compose_cfg, "max_steps=9", "log_interval=3", "eval_interval=9", "max_time_s=1e6")
    summary = train(cfg, tmp_path)
    monkeypatch.undo()
    assert summary["status"] == "completed"
    # before step 1: build_run's checks (the norm preflight) and the evaluation of step 0; then
    # steps 3 and 6: one read of the 3 buffered steps each; step 9: that, and the evaluation's one
    # (the time budget's clock and stop check read nothing: max_time_s is set, never reached)
    assert [s for s in syncs if s] == [3, 6, 9, 9] and not any(syncs[: syncs.index(3)])
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 3, 6, 9]


def test_divergence_between_log_steps_is_found_at_its_exact_step(
    compose_cfg, tmp_path, monkeypatch
):
    from normlab.training import step as training_step

    real_step = training_step.train_step
    losses = []

    def nan_at_step_6(run, step, lr, *args, **kwargs):
        loss, grad = real_step(run, step, lr, *args, **kwargs)
        losses.append(float(loss))
        return (loss * float("nan") if step + 1 == 6 else loss), grad

    monkeypatch.setattr(training_step, "train_step", nan_at_step_6)
    cfg = _tiny(compose_cfg, "max_steps=12", "log_interval=4", "eval_interval=12")
    summary = train(cfg, tmp_path, RunOptions(ckpt_interval=0))
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == 6
    assert summary["diverged_reason"] == "non-finite loss nan"
    assert summary["last_finite_loss"] == losses[4]  # step 5's loss (one micro-batch)
    assert len(losses) == 8, "noticed at the next sync, step 8"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 4, 6] and rows[2]["train/loss"] is None
    assert not list((tmp_path / "checkpoints").glob("*.pt"))


def test_adamw_on_cpu_is_foreach_and_steps_like_the_for_loop_adamw(compose_cfg):
    from normlab.training.setup import build_run

    run = build_run(_tiny(compose_cfg))
    assert run.optimizer.defaults["foreach"] is True and not run.optimizer.defaults["fused"]
    torch.manual_seed(0)
    params = [torch.randn(8, 4, requires_grad=True), torch.randn(4, requires_grad=True)]
    twins = [p.detach().clone().requires_grad_(True) for p in params]
    ours = torch.optim.AdamW(params, lr=1e-2, foreach=True)
    loop = torch.optim.AdamW(twins, lr=1e-2, foreach=False)
    for _ in range(5):
        for opt, ps in ((ours, params), (loop, twins)):
            opt.zero_grad()
            (ps[0].sin().sum() + ps[1].square().sum()).backward()
            opt.step()
    assert all(torch.equal(a, b) for a, b in zip(params, twins, strict=True))


# --- issue 15: runs that say what happened -------------------------------------------------------


def test_a_resumed_process_leaves_its_own_warm_up_steps_out_of_the_step_times(
    compose_cfg, tmp_path, monkeypatch, signal_after_step
):
    def stop(self, record=True):  # each process's first timed step is its slow warm-up
        dt = 1000.0 if not self.times_ms else 10.0
        if record:
            self.times_ms.append(dt)
        return dt

    monkeypatch.setattr(StepTimer, "stop", stop)
    cfg = _tiny(compose_cfg, "max_steps=8")  # TINY: timing_warmup_steps=1
    signal_after_step(signal.SIGTERM, 3)
    assert train(cfg, tmp_path, RunOptions(ckpt_interval=0))["status"] == "interrupted"
    summary = train(cfg, tmp_path, RunOptions(ckpt_interval=0, resume="auto"))
    assert summary["status"] == "completed" and summary["resumed"]["from_step"] == 3
    # steps 2-3 of the first process and 5-8 of the resumed one; 1 and 4 were warm-up
    assert summary["step_times_ms"] == [10.0] * 6
    assert summary["step_time_ms_median"] == summary["step_time_ms_p90"] == 10.0


def test_an_fp16_run_whose_scaler_skipped_every_step_did_not_complete(compose_cfg, tmp_path):
    from normlab.training.checkpoint import load_latest
    from normlab.training.setup import build_model, build_run

    # a loss scale of 3e38 overflows every gradient; halving it 6 times does not get it back
    cfg = _tiny(compose_cfg, "precision=fp16", "precision.init_scale=3e38")
    summary = train(cfg, tmp_path)
    assert summary["status"] == "diverged" and summary["skipped_steps"] == 6
    assert summary["calibration_skips"] == 6  # all at start-up, yet none trained: not completed
    assert summary["diverged_reason"].startswith("the fp16 grad scaler skipped 6 of 6 optimizer")
    assert summary["final_val_loss"] is None
    # the count is right: not one parameter moved from its initial value
    initial = build_model(build_run(cfg).cfg, "cpu").state_dict()
    saved = load_latest(tmp_path / "checkpoints").state["model"]
    assert all(torch.equal(saved[k], v) for k, v in initial.items())


def test_a_healthy_run_counts_no_skipped_steps(compose_cfg, tmp_path):
    summary = train(_tiny(compose_cfg, "max_steps=2"), tmp_path)
    assert summary["status"] == "completed" and summary["skipped_steps"] == 0


@pytest.mark.parametrize(
    ("skipped", "fraction", "status"),
    [(2, 0.5, "completed"), (3, 0.5, "completed"), (4, 0.5, "diverged"), (1, 0.1, "diverged"),
     (5, None, "completed"), (6, None, "diverged")],
)  # fmt: skip
def test_the_skipped_fraction_rule_of_a_finished_run(skipped, fraction, status):
    from types import SimpleNamespace

    from normlab.training.record import Progress, RunRecord

    progress = Progress(
        step=5, done=6, train_time_s=0.0, val_loss=None, val_row={}, wall_before=0.0, t_start=0.0
    )
    record = RunRecord(progress=progress, summary={"status": "running"})
    metrics = SimpleNamespace(skipped_steps=skipped, calibration_skips=0, last_finite_loss=1.0)
    record.complete("max_steps", metrics, fraction)  # 6 steps, ``skipped`` of them skipped
    assert record.status == status


def test_the_divergence_rule_relative_to_the_first_loss():
    from normlab.training.metrics import Limits

    rule = Limits(divergence_factor=2.0, vocab_size=256)  # ln 256 = 5.545
    assert rule.reason(11.0, 1.0, first_loss=5.0) is None  # 11 < 2 x 5.545
    assert rule.reason(11.1, 1.0, first_loss=5.0).startswith("loss 11.1 above divergence_factor=2")
    assert rule.reason(13.0, 1.0, first_loss=7.0) is None  # the first loss, when above ln V
    assert rule.reason(14.1, 1.0, first_loss=7.0) is not None
    assert Limits(vocab_size=256).reason(1e9, 1.0, first_loss=5.0) is None  # null: off


def test_a_loss_above_divergence_factor_times_the_first_ends_the_run(
    compose_cfg, tmp_path, monkeypatch
):
    from normlab.training import step as training_step

    real_step = training_step.train_step

    def loss_x3_at_step_4(run, step, lr, *args, **kwargs):
        loss, grad = real_step(run, step, lr, *args, **kwargs)
        return (loss * 3 if step + 1 == 4 else loss), grad

    monkeypatch.setattr(training_step, "train_step", loss_x3_at_step_4)
    summary = train(_tiny(compose_cfg), tmp_path / "a")  # default divergence_factor=2
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == 4
    assert "above divergence_factor=2 x 5.545" in summary["diverged_reason"]
    summary = train(_tiny(compose_cfg, "divergence_factor=null"), tmp_path / "b")
    assert summary["status"] == "completed"


def test_compilation_never_falls_back_to_eager_silently(compose_cfg):
    import torch._dynamo

    from normlab.training.setup import describe_error, forbid_eager_fallback

    f = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    rule = forbid_eager_fallback(_tiny(compose_cfg, "compile=true"))
    with rule, torch._dynamo.config.patch(recompile_limit=2):
        f(torch.ones(2, dtype=torch.float32))
        f(torch.ones(2, dtype=torch.float64))
        with pytest.raises(Exception) as e:  # the 3rd dtype is a 3rd graph: past the limit
            f(torch.ones(2, dtype=torch.float16))
        assert type(e.value).__name__ == "FailOnRecompileLimitHit"
        assert "recompile_limit=2 times" in describe_error(e.value)
    assert "refuses to let it fall back to eager silently" in describe_error(e.value)


def test_a_compiled_run_forbids_eager_fallback_during_its_steps_and_leaves_dynamo_as_it_was(
    compose_cfg, tmp_path, monkeypatch
):
    """Issue 37 (kind 17): building a compiled run set dynamo's ``fail_on_recompile_limit_hit``
    for the rest of the process. The rule holds while the run's steps run, and dynamo's config
    is the same before and after (``torch.compile`` is left out: the rule, not inductor, is under
    test)."""
    import torch._dynamo

    from normlab.training import step as training_step
    from normlab.training.setup import build_run

    real_step, seen = training_step.train_step, []

    def noting_the_rule(run, step, lr, *args, **kwargs):
        seen.append(torch._dynamo.config.fail_on_recompile_limit_hit)
        return real_step(run, step, lr, *args, **kwargs)

    monkeypatch.setattr(training_step, "train_step", noting_the_rule)
    monkeypatch.setattr(torch, "compile", lambda model, *args, **kwargs: model)
    cfg = _tiny(compose_cfg, "compile=true", "max_steps=2")
    before = torch._dynamo.config.get_config_copy()
    build_run(cfg)
    assert torch._dynamo.config.get_config_copy() == before  # building changes no global setting
    assert train(cfg, tmp_path)["status"] == "completed"
    assert seen == [True, True] and before["fail_on_recompile_limit_hit"] is False
    assert torch._dynamo.config.get_config_copy() == before


def test_a_norm_whose_statistic_overflowed_is_flagged_in_the_summary(
    compose_cfg, tmp_path, monkeypatch
):
    from normlab.training import setup

    real_build = setup.build_model

    def huge_embeddings(cfg, device):  # fp32 rows of RMS 1e20: x^2 overflows, the norm gives 0
        model = real_build(cfg, device)
        with torch.no_grad():
            model.tok_emb.weight.mul_(1e20 / 0.02)
        return model

    monkeypatch.setattr(setup, "build_model", huge_embeddings)
    cfg = _tiny(compose_cfg, "max_steps=2", "diag_interval=1", "norm.impl=reference")
    summary = train(cfg, tmp_path)
    flag = summary["norm_zero_rows"]
    assert flag["step"] == 1 and flag["rows"]["block0/attn_in"] == 4 * 32  # every row of the batch
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["diag/block0/attn_in_zero_rows"] == 128  # rows[0]: step 0's evaluation
    # and a healthy run has no flag
    monkeypatch.undo()
    summary = train(_tiny(compose_cfg, "max_steps=2", "diag_interval=1"), tmp_path / "ok")
    assert "norm_zero_rows" not in summary
