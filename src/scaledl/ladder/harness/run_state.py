"""How a run's training state is saved, bounded, checked and loaded, per framework.

A `State` knows how to take a framework's state and give it back: plain PyTorch (a model and an
optimizer), FSDP2 (whole tensors gathered from the shards), or a DeepSpeed engine (which writes
its own partitioned checkpoints).  A `Store` puts states on disk under OUT_DIR:

- at most `--keep-checkpoints` of them (older ones are deleted after a newer one is whole);
- each records what it was written by (rung, world size, data, batch, parameter count), and a
  resume that does not match is refused before anything is loaded: a DDP checkpoint resumed by
  FSDP2, or one written by 1 rank resumed by 2, would otherwise train on and fail later, or
  silently skip data.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from scaledl import checkpoint, quiet
from scaledl.checkpoint import CheckpointError

# Advice every refused resume ends with: both are command lines that work on that OUT_DIR.
START_OVER = "start the run over with --overwrite instead of --resume, or name another --out-dir"
MATCH = ("rung", "world_size", "dataset", "train_limit", "batch_size", "grad_accum", "num_params")
# Compared where the checkpoint records them (older ones do not): the data-parallel replicas, which
# decide each rank's samples (the pipeline rung's --dp, at the same world size).
MATCH_IF_RECORDED = ("replicas",)


class State:
    """A framework's training state (every rank calls every method: some are collectives)."""

    files = True  # written by rank 0 as one checkpoint.pt (False: the framework writes a directory)
    num_params: int | None = None  # the model's parameter count where it is not this rank's (pipeline stages)

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def bytes_per_rank(self) -> int:
        raise NotImplementedError

    def in_sync(self, comm) -> bool | None:
        """True when every rank holds the same parameters; None where they should not (pipeline)."""
        from scaledl import distributed

        if comm.world_size == 1 or comm.all_gather_object is None:
            return None
        return len(set(comm.all_gather_object(distributed.params_fingerprint(self.full_model_state())))) == 1

    def full_model_state(self):
        return self.state_dict()["model"]


class TorchState(State):
    """A plain model and optimizer (for DDP, the model's `.module`)."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def full_model_state(self):
        return self.model.state_dict()

    def bytes_per_rank(self) -> int:
        from scaledl import report

        return report.model_state_bytes(self.model, self.optimizer)


class FullState(TorchState):
    """FSDP2: each rank holds shards; a checkpoint holds whole tensors, gathered on save (a
    collective) and scattered back to the shards on load, so it also loads into a plain model."""

    def _options(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True)

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        with quiet.flatten_advice():
            return {"model": get_model_state_dict(self.model, options=self._options()),
                    "optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=self._options())}

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        set_model_state_dict(self.model, state["model"], options=self._options())
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=self._options())

    def full_model_state(self):
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        with quiet.flatten_advice():
            return get_model_state_dict(self.model, options=self._options())


class StageState(TorchState):
    """Pipeline stages: each rank holds its own chunks of the model (`model` a ModuleList of them).  A
    checkpoint holds the whole model, every rank's tensors gathered by name (a collective), and each
    parameter's optimizer state by name; a resume puts each rank's own back, whatever chunks the
    schedule gives it.  The stages keep the names the whole model gives their layers; `num_params` is
    the whole model's count, which a resume checks (each rank holds a different share of it)."""

    def __init__(self, model, optimizer, num_params: int):
        super().__init__(model, optimizer)
        self.num_params = num_params

    def in_sync(self, comm) -> None:
        return None

    def _names(self) -> list[str]:
        """This rank's parameters by their names in the whole model, in the optimizer's order."""
        return [name for chunk in self.model for name, _ in chunk.named_parameters()]

    def state_dict(self) -> dict:
        import torch.distributed as dist

        names, optimizer = self._names(), self.optimizer.state_dict()
        mine = ({k: v.detach().cpu() for chunk in self.model for k, v in chunk.state_dict().items()},
                {names[index]: {k: v.cpu() if hasattr(v, "cpu") else v for k, v in state.items()}
                 for index, state in optimizer["state"].items()})
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine)
        model, state = {}, {}
        for part_model, part_state in parts:  # the pipelines of a dp x pp grid hold the same values
            model |= part_model
            state |= part_state
        groups = [{k: v for k, v in group.items() if k != "params"} for group in optimizer["param_groups"]]
        return {"model": model, "optimizer": {"state_by_name": state, "param_groups": groups}}

    def load_state_dict(self, state: dict) -> None:
        for chunk in self.model:
            chunk.load_state_dict({name: state["model"][name] for name in chunk.state_dict()})
        saved, current = state["optimizer"], self.optimizer.state_dict()
        by_name = saved["state_by_name"]
        self.optimizer.load_state_dict({
            "state": {index: by_name[name] for index, name in enumerate(self._names()) if name in by_name},
            "param_groups": [{**group, "params": own["params"]}
                             for group, own in zip(saved["param_groups"], current["param_groups"])]})


class DeepSpeedState(State):
    """A DeepSpeed engine: it saves and loads its own (partitioned) checkpoint directory."""

    files = False

    def __init__(self, engine):
        self.engine = engine

    def bytes_per_rank(self) -> int:
        from scaledl import zero_memory

        return zero_memory.predict_for_engine(self.engine)["total"]

    def in_sync(self, comm) -> bool | None:
        import deepspeed

        from scaledl import distributed

        if comm.world_size == 1:
            return None
        # ZeRO-3 keeps only a partition of each parameter: gather them to compare.
        parameters = list(self.engine.module.parameters())
        with deepspeed.zero.GatheredParameters(parameters, enabled=self.engine.zero_optimization_stage() == 3):
            return distributed.params_in_sync(self.engine.module)


class Store:
    """Checkpoints under OUT_DIR: `checkpoint.pt` (or DeepSpeed's `checkpoint/`), the newest
    `keep` of them, each with the metadata a resume must match."""

    def __init__(self, out_dir: str, state: State, meta: dict, keep: int, is_main: bool, barrier):
        self.out_dir, self.state, self.meta, self.keep = Path(out_dir), state, meta, keep
        self.is_main, self.barrier = is_main, barrier
        self.path = self.out_dir / ("checkpoint.pt" if state.files else "checkpoint")
        self.last_step: int | None = None  # the step of the checkpoint now at self.path

    # -- saving ---------------------------------------------------------------------------
    def save(self, scheduler, epoch: int, step: int) -> None:
        if step == self.last_step:
            return  # (the end of training right after a --checkpoint-every save: nothing new)
        if self.state.files:
            state = self.state.state_dict()  # on every rank: gathering shards is a collective
            if self.is_main:
                self._keep_previous()
                checkpoint.save(self.path, model=state["model"], optimizer=state["optimizer"], scheduler=scheduler,
                                epoch=epoch, step=step, extra={"meta": self.meta})
            self.last_step = step
        else:
            engine = self.state.engine
            engine.save_checkpoint(str(self.path), tag=f"global_step{step}",
                                   client_state={"epoch": epoch, "step": step, "meta": self.meta})
            self.barrier()  # every rank's partition is written before old ones go
            self.last_step = step
            if self.is_main:
                (self.path / "meta.json").write_text(json.dumps(self.meta) + "\n")
                self._prune(sorted(self.path.glob("global_step*"), key=_step_of)[:-self.keep])

    def _keep_previous(self) -> None:
        """Before checkpoint.pt is replaced, keep it as checkpoint.stepN.pt if more than one is kept."""
        if self.keep > 1 and self.path.exists():
            if self.last_step is None:
                self.last_step = checkpoint.load(self.path, restore_rng=False)["step"]
            older = self.out_dir / f"checkpoint.step{self.last_step}.pt"
            older.unlink(missing_ok=True)
            older.hardlink_to(self.path)
        self._prune(sorted(self.out_dir.glob("checkpoint.step*.pt"), key=_step_of)[:-(self.keep - 1) or None])

    @staticmethod
    def _prune(paths) -> None:
        for path in paths:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)

    # -- loading --------------------------------------------------------------------------
    def load(self, scheduler) -> dict:
        """Check the newest checkpoint against this run, then load it; return its epoch and step."""
        if self.state.files:
            try:
                found = checkpoint.load(self.path, restore_rng=False)
            except CheckpointError as error:
                raise CheckpointError(f"{error}{self._older_copies()}") from None
            self._check(found.get("extra", {}).get("meta"), self.path)
            self.state.load_state_dict(found)
            if scheduler is not None and "scheduler" in found:
                scheduler.load_state_dict(found["scheduler"])
            checkpoint.set_rng_state(found["rng"])
            self.last_step = found["step"]
            return found
        meta_file = self.path / "meta.json"
        if not meta_file.is_file():
            raise CheckpointError(f"the DeepSpeed checkpoint {self.path} is incomplete (no meta.json: stopped while "
                                  f"saving its first step?): {START_OVER}")
        try:
            meta = json.loads(meta_file.read_text())
        except ValueError:
            meta = None
        self._check(meta, self.path)
        _, client_state = self.state.engine.load_checkpoint(str(self.path))
        if client_state is None:
            raise CheckpointError(f"the DeepSpeed checkpoint {self.path} holds no step DeepSpeed can load: "
                                  f"{START_OVER}")
        self.last_step = client_state["step"]
        return client_state

    def _older_copies(self) -> str:
        """Advice that names the older checkpoints `--keep-checkpoints` left, if any."""
        older = sorted(self.out_dir.glob("checkpoint.step*.pt"), key=_step_of)
        return (f"; or resume from the older {older[-1].name}: move it to {self.path.name} first, then "
                "--resume again" if older else "")

    def _check(self, meta, where) -> None:
        if not isinstance(meta, dict):
            raise CheckpointError(f"{where} does not say which run wrote it (written by an older scaledl?): "
                                  f"{START_OVER}")
        keys = MATCH + tuple(key for key in MATCH_IF_RECORDED if key in meta and key in self.meta)
        differ = [f"{key} {meta.get(key)!r} (now {self.meta[key]!r})" for key in keys
                  if meta.get(key) != self.meta[key]]
        if differ:
            raise CheckpointError(
                f"{where} was written by another kind of run: {', '.join(differ)}; resume with the same rung, "
                f"number of ranks, data and --batch-size, or {START_OVER}")


def _step_of(path: Path) -> int:
    found = re.search(r"(\d+)", path.name.rsplit("step", 1)[-1])
    return int(found.group(1)) if found else -1
