"""MPS control daemons: one per GPU (or per MIG device), each with its own pipe and log directory.

Starting a daemon puts its GPU in EXCLUSIVE_PROCESS compute mode (so only the MPS server holds a
context), runs ``nvidia-cuda-mps-control -d`` with ``CUDA_VISIBLE_DEVICES`` set to that device and
``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY`` set to the daemon's own directories, then
sends the default client limits (``set_default_active_thread_percentage``,
``set_default_device_pinned_mem_limit``) on the control program's stdin. Status asks the daemon
(``get_server_list``, ``get_default_*``); stop sends ``quit`` and restores DEFAULT compute mode.

MPS gives no isolation between clients (memory, faults): every change requires the caller's
explicit consent. Clients of different Unix users are serialised by the control daemon (one MPS
server, of one user, at a time): see docs/gpu-mps.md and ``user_model``. What a daemon reports and
what a start or stop plans are models (``calque.models.mps``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from calque.errors import InfrastructureError, RefusedError, UsageError
from calque.gpu.backend import GpuBackend
from calque.models.mps import MpsDaemon, MpsResult, MpsSettings, MpsStatus, MpsStep, MpsUserModel, pinned_bytes

CONTROL_PROGRAM = "nvidia-cuda-mps-control"
DEFAULT_PIPE_ROOT = Path("/run/calque/mps")
DEFAULT_LOG_ROOT = Path("/var/log/calque/mps")
_TIMEOUT_S = 15.0
DEFAULT_PERCENTAGE = 100  # what a new control daemon reports before any limit is set

CONSENT_MESSAGE = (
    "MPS shares one GPU between processes with no memory or fault isolation: a client can read or crash "
    "another's work. Pass --i-understand-shared-gpu-has-no-isolation (module: "
    "i_understand_shared_gpu_has_no_isolation: true) to go ahead, or use MIG slices for isolation"
)


def require_consent(consent: bool) -> None:
    """The MPS safety gate (exit code 4 without consent)."""
    if not consent:
        raise RefusedError(CONSENT_MESSAGE)


class MpsControl:
    """Start, stop and inspect MPS control daemons on one host."""

    def __init__(
        self,
        backend: GpuBackend,
        *,
        pipe_root: Path | str = DEFAULT_PIPE_ROOT,
        log_root: Path | str = DEFAULT_LOG_ROOT,
        program: str = CONTROL_PROGRAM,
    ) -> None:
        self.backend = backend
        self.pipe_root = Path(pipe_root)
        self.log_root = Path(log_root)
        self.program = program

    # -- targets and the control program ------------------------------------------------------

    def targets(self, gpus: list[int] | None = None, per_mig: bool = False) -> list[tuple[str, int, str]]:
        """(name, gpu index, device uuid) for each daemon: every GPU, or every MIG device of the GPUs."""
        all_gpus = self.backend.gpus()
        known = {g.index for g in all_gpus}
        unknown = sorted(set(gpus or []) - known)
        if unknown:
            raise UsageError(f"no GPU {unknown} on this host; it has GPUs {sorted(known)}")
        chosen = [g for g in all_gpus if gpus is None or g.index in gpus]
        if not per_mig:
            return [(f"gpu{g.index}", g.index, g.uuid) for g in chosen]
        idx = {g.index for g in chosen}
        migs = [d for d in self.backend.mig_devices() if d.gpu_index in idx]
        if not migs:
            raise UsageError("per-MIG daemons were asked for but the selected GPUs have no MIG devices")
        return [(f"mig-{d.uuid}", d.gpu_index, d.uuid) for d in migs]

    def env(self, target: str) -> dict[str, str]:
        """The variables a client needs to reach this daemon (the session service hands them out)."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_root / target),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_root / target),
        }

    def _binary(self) -> str:
        found = shutil.which(self.program)
        if found is None:
            raise InfrastructureError(
                f"{self.program} is not on PATH: install the NVIDIA driver's CUDA MPS tools (nvidia-compute-utils)"
            )
        return found

    def _control(self, target: str, *commands: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self._binary()],
            input="".join(c + "\n" for c in commands),
            capture_output=True,
            text=True,
            env={**os.environ, **self.env(target)},
            timeout=_TIMEOUT_S,
        )

    def _ask(self, target: str, command: str) -> str | None:
        """One command's reply, or None when no daemon answers."""
        proc = self._control(target, command)
        return proc.stdout.strip() if proc.returncode == 0 else None

    def _describe(self, target: str, index: int, uuid: str) -> MpsDaemon:
        servers = self._ask(target, "get_server_list")
        pct = self._ask(target, "get_default_active_thread_percentage") if servers is not None else None
        pinned = self._ask(target, "get_default_device_pinned_mem_limit 0") if servers is not None else None
        gpu = next((g for g in self.backend.gpus() if g.index == index), None)
        env = self.env(target)
        return MpsDaemon(
            target=target,
            gpu_index=index,
            device_uuid=uuid,
            pipe_dir=env["CUDA_MPS_PIPE_DIRECTORY"],
            log_dir=env["CUDA_MPS_LOG_DIRECTORY"],
            running=servers is not None,
            servers=[int(x) for x in (servers or "").split() if x.isdigit()],
            active_thread_percentage=int(float(pct)) if pct and re.fullmatch(r"[\d.]+", pct) else None,
            pinned_memory_limit=pinned if pinned and pinned not in ("0", "") else None,
            compute_mode=gpu.compute_mode if gpu else None,
        )

    # -- the three verbs ----------------------------------------------------------------------

    def status(self, gpus: list[int] | None = None, per_mig: bool = False) -> MpsStatus:
        return MpsStatus(
            daemons=[self._describe(*t) for t in self.targets(gpus, per_mig)],
            user_model=self.user_model(),
        )

    def plan_start(self, settings: MpsSettings, gpus: list[int] | None = None, per_mig: bool = False) -> list[MpsStep]:
        """What starting daemons with ``settings`` takes per target, and each daemon's predicted state after."""
        targets = self.targets(gpus, per_mig)
        self._check_startable({index for _, index, _ in targets}, per_mig)
        steps = []
        for target, index, uuid in targets:
            d = self._describe(target, index, uuid)
            mode = "EXCLUSIVE_PROCESS" if not per_mig and d.compute_mode != "EXCLUSIVE_PROCESS" else None
            cmds = self._setting_commands(settings, d)
            actions = [f"{target}: set compute mode {mode}"] if mode else []
            actions += [] if d.running else [f"{target}: start {self.program} -d"]
            actions += [f"{target}: {c}" for c in cmds]
            sent = " ".join(cmds)
            after = d.model_copy(
                update={
                    "running": True,
                    "compute_mode": mode or d.compute_mode,
                    "active_thread_percentage": settings.active_thread_percentage
                    if "active_thread" in sent
                    else (d.active_thread_percentage if d.running else DEFAULT_PERCENTAGE),
                    "pinned_memory_limit": settings.pinned_memory_limit
                    if "pinned_mem" in sent
                    else (d.pinned_memory_limit if d.running else None),
                }
            )
            steps.append(
                MpsStep(target=target, gpu_index=index, device_uuid=uuid, before=d, after=after if actions else d,
                        actions=actions, compute_mode=mode, launch=not d.running, commands=cmds)
            )  # fmt: skip
        return steps

    def plan_stop(self, gpus: list[int] | None = None, per_mig: bool = False) -> list[MpsStep]:
        """What stopping the targets' daemons takes, and each one's predicted state after."""
        steps = []
        for target, index, uuid in self.targets(gpus, per_mig):
            d = self._describe(target, index, uuid)
            mode = "DEFAULT" if not per_mig and d.compute_mode == "EXCLUSIVE_PROCESS" else None
            actions = [f"{target}: quit the control daemon"] if d.running else []
            actions += [f"{target}: set compute mode {mode}"] if mode else []
            after = d.model_copy(
                update={"running": False, "servers": [], "active_thread_percentage": None, "pinned_memory_limit": None,
                        "compute_mode": mode or d.compute_mode}
            )  # fmt: skip
            steps.append(
                MpsStep(target=target, gpu_index=index, device_uuid=uuid, before=d, after=after if actions else d,
                        actions=actions, compute_mode=mode, quit=d.running)
            )  # fmt: skip
        return steps

    def run_steps(self, steps: list[MpsStep], progress: Callable[[str], None] | None = None) -> list[MpsDaemon]:
        """Take each step's actions (in its planned order); returns every daemon as it is afterwards."""
        say = progress or (lambda _m: None)
        for st in steps:
            for a in st.actions:
                say(a)
            if st.quit:
                self._control(st.target, "quit")
                self._wait(st.target, running=False)
            if st.compute_mode is not None:
                self.backend.set_compute_mode(st.gpu_index, st.compute_mode)
            if st.launch:
                self._launch(st.target, st.device_uuid)
            if st.commands:
                proc = self._control(st.target, *st.commands)
                if proc.returncode != 0:
                    out = (proc.stdout + proc.stderr).strip()
                    raise InfrastructureError(f"{st.target}: MPS refused {st.commands}: {out}")
        return [self._describe(st.target, st.gpu_index, st.device_uuid) for st in steps]

    def start(
        self,
        settings: MpsSettings,
        *,
        consent: bool,
        gpus: list[int] | None = None,
        per_mig: bool = False,
        check: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> MpsResult:
        """Ensure a daemon runs per target with ``settings``; a satisfied host changes nothing."""
        require_consent(consent)
        return self._result(self.plan_start(settings, gpus, per_mig), check, progress)

    def stop(
        self,
        *,
        consent: bool,
        gpus: list[int] | None = None,
        per_mig: bool = False,
        check: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> MpsResult:
        """Ensure no daemon runs for the targets, and their GPUs are back in DEFAULT compute mode."""
        require_consent(consent)
        return self._result(self.plan_stop(gpus, per_mig), check, progress)

    def _result(self, steps: list[MpsStep], check: bool, progress: Callable[[str], None] | None) -> MpsResult:
        actions = [a for st in steps for a in st.actions]
        daemons = [st.before for st in steps] if check or not actions else self.run_steps(steps, progress)
        return MpsResult(changed=bool(actions), actions=actions, daemons=daemons)

    # -- helpers ------------------------------------------------------------------------------

    def _check_startable(self, indices: set[int], per_mig: bool) -> None:
        for g in self.backend.gpus():
            if g.index not in indices:
                continue
            if g.mig_pending != g.mig_current:
                raise InfrastructureError(
                    f"GPU {g.index} has a MIG mode change pending a reset, and MPS daemons fail to start until "
                    "the GPU is reset (observed on g7/g7e): reset it (calque gpu mig apply --allow-reset) or reboot"
                )
            if g.mig_current and not per_mig:
                raise UsageError(
                    f"GPU {g.index} is in MIG mode: run one daemon per MIG device (--per-mig; module: per_mig: true)"
                )

    @staticmethod
    def _setting_commands(settings: MpsSettings, d: MpsDaemon) -> list[str]:
        cmds = []
        pct = settings.active_thread_percentage
        if pct is not None and (not d.running or d.active_thread_percentage != pct):
            cmds.append(f"set_default_active_thread_percentage {pct}")
        lim = settings.pinned_memory_limit
        if lim is not None:
            have = d.pinned_memory_limit
            if not d.running or have is None or pinned_bytes(have) != pinned_bytes(lim):
                cmds.append(f"set_default_device_pinned_mem_limit 0 {lim}")
        return cmds

    def _launch(self, target: str, uuid: str) -> None:
        env = self.env(target)
        for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
            Path(env[key]).mkdir(parents=True, exist_ok=True, mode=0o755)
        proc = subprocess.run(
            [self._binary(), "-d"],
            capture_output=True,
            text=True,
            env={**os.environ, **env, "CUDA_VISIBLE_DEVICES": uuid},
            timeout=_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            raise InfrastructureError(
                f"{target}: {self.program} -d failed: {(proc.stdout + proc.stderr).strip()}; "
                f"see {env['CUDA_MPS_LOG_DIRECTORY']}"
            )
        self._wait(target, running=True)

    def _wait(self, target: str, running: bool) -> None:
        deadline = time.monotonic() + _TIMEOUT_S
        while time.monotonic() < deadline:
            if (self._ask(target, "get_server_list") is not None) == running:
                return
            time.sleep(0.05)
        state = "answer" if running else "exit"
        raise InfrastructureError(
            f"{target}: the MPS control daemon did not {state} within {_TIMEOUT_S:.0f}s; "
            f"see {self.env(target)['CUDA_MPS_LOG_DIRECTORY']}"
        )

    def user_model(self) -> MpsUserModel | None:
        """Detect whether the installed MPS advertises a multi-user mode (otherwise: serialised per user)."""
        binary = shutil.which(self.program)
        if binary is None:
            return None
        try:
            proc = subprocess.run(
                [binary, "-h"], capture_output=True, text=True, timeout=_TIMEOUT_S, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = proc.stdout + proc.stderr
        if re.search(r"multi-?user", text, re.IGNORECASE):
            return MpsUserModel(
                mode="multi-user",
                evidence=f"{self.program} -h advertises a multi-user option",
                slot_policy="slots of one daemon may go to different Unix users at once",
            )
        return MpsUserModel(
            mode="serialised-per-user",
            evidence=f"{self.program} -h advertises no multi-user option: one MPS server (one user) at a time",
            slot_policy=(
                "give all slots of one daemon to one Unix user at a time, or run every tenant's clients under "
                "one service account; a second user's client otherwise waits until the first user's clients exit"
            ),
        )
