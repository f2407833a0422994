"""One ScienceWorld simulator: a JVM of its own, driven over py4j, with a lean step.

What must hold:
- One JVM per `Simulator`, started with a small heap (`-Xmx<heap>m -XX:+UseSerialGC`, about 0.2-0.3 GB resident
  instead of 1.1-1.4 GB with Java's default heap) and reused across episodes: `load()` switches the task.
- The simulator has global state: a `Simulator` is used by one thread at a time (the env wraps it in
  `ThreadedEnv`, which gives it one worker thread of its own).
- `step()` calls only the simulator's step, score, completed flag and move count. The package's stock
  `ScienceWorldEnv.step` also enumerates every valid action-object combination, the look-around text, the
  inventory and the task description on every call (80-150 ms instead of about 15 ms); `launch.bench envs_ii`
  measures both side by side.
- `close()` ends the JVM, and is idempotent; JVMs still alive at interpreter exit are closed by an atexit hook,
  and the JVM also exits by itself when this process dies (py4j's die_on_exit watches its stdin).
"""
from __future__ import annotations

import atexit
import threading
import weakref
from dataclasses import dataclass

from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway

_LIVE: "weakref.WeakSet[Simulator]" = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


@dataclass(frozen=True)
class SimStep:
    observation: str
    score: int  # the simulator's progress score, 0..100, or -100 once the task has failed
    completed: bool  # the simulator's own completed flag (it stays false after a failure)
    moves: int


def jvm_options(heap_mb: int) -> list[str]:
    return [f"-Xmx{heap_mb}m", f"-Xms{min(64, heap_mb)}m", "-XX:+UseSerialGC", "-Xss4m"]


class Simulator:
    """A ScienceWorld JVM. Construction starts the JVM (1.5-3.5 s)."""

    def __init__(self, heap_mb: int = 256):
        from scienceworld.constants import BASEPATH, JAR_PATH

        self.heap_mb = heap_mb
        # The gateway listens on loopback; its auth token (made by the JVM, read from its stdout) keeps other
        # local users from driving the JVM (py4j can call any Java method, files and processes included).
        port, token, proc = launch_gateway(classpath=JAR_PATH, die_on_exit=True, cwd=BASEPATH, return_proc=True,
                                           javaopts=jvm_options(heap_mb), enable_auth=True)
        self.process = proc
        try:
            self._gateway = JavaGateway(
                gateway_parameters=GatewayParameters(auto_field=True, port=port, auth_token=token),
                java_process=proc)
            self._server = self._gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        except BaseException:
            self._kill()
            raise
        self._closed = False
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return not self._closed and self.process.poll() is None

    def load(self, task_name: str, variation: int, simplifications: str, gold_path: bool = False) -> None:
        """Switch the simulator to (task, variation). `gold_path` also has it plan its own solution."""
        self._server.load(task_name, variation, simplifications, gold_path)

    def task_description(self) -> str:
        return str(self._server.getTaskDescription())

    def look(self) -> str:
        """The "look around" text; a free action (consumes no move)."""
        return str(self._server.freeActionLook())

    def gold_actions(self) -> list[str]:
        """The simulator's own solution for the loaded task (load it with gold_path=True first)."""
        return [str(a) for a in self._server.getGoldActionSequence()]

    def task_names(self) -> list[str]:
        return [str(n) for n in self._server.getTaskNames()]

    def max_variations(self, task_name: str) -> int:
        return int(self._server.getTaskMaxVariations(task_name))

    def split_variations(self) -> tuple[list[int], list[int], list[int]]:
        """The loaded task's train, dev and test variations, as the simulator assigns them."""
        s = self._server
        return ([int(v) for v in s.getVariationsTrain()], [int(v) for v in s.getVariationsDev()],
                [int(v) for v in s.getVariationsTest()])

    def step(self, command: str) -> SimStep:
        observation = str(self._server.step(command))
        score = int(round(100 * float(self._server.getScore())))
        completed = bool(self._server.getCompleted())
        moves = int(self._server.getNumMoves())
        return SimStep(observation, score, completed, moves)

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self._gateway.shutdown()
        except Exception:  # noqa: BLE001 - the JVM may already be gone; it is killed below either way
            pass
        self._kill()

    def kill(self) -> None:
        """SIGKILL the JVM now, from any thread (a call on the gateway then fails at once)."""
        self._closed = True
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def _kill(self) -> None:
        proc = self.process
        if proc.poll() is None:
            try:  # die_on_exit: a newline on stdin makes the JVM exit by itself
                proc.stdin.write(b"\n")
                proc.stdin.flush()
                proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - fall through to kill
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@atexit.register
def _close_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for sim in live:
        sim.close()
