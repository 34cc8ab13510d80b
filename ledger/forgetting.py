"""A fold that forgets what no later decision reads, for a run whose memory must not
grow with its input (``tillerman replay``): the daemon keeps everything (``status``
and ``intents show`` read settled intents' histories).

- A settled intent (terminal: ``projections.is_open`` is False) is dropped once settled;
  only its final state is counted (``intent_counts``). No step reads a settled view:
  the policy decides open intents, and a finding is proposed once per run
  (``Step.seen_findings``); the ledger still refuses a second proposal of the id.
- An idle thread is dropped when its source has ended (``forget_thread``): it has no
  open intent and no rule condition that could ever fire on its state (no timer, no
  counted failure), so it takes part in no later decision unless a later entry about it
  is folded — which starts it afresh. The caller decides when a source has ended.
  A thread that had a Codex goal leaves its goal, the statuses it went through and the
  triggers of its recent turns behind (``goal_threads``, ``goal_statuses``: the run's
  summary shows them).
"""

from __future__ import annotations

from collections import Counter

from tillerman.ledger.events import Envelope, GoalCleared, GoalUpdated
from tillerman.ledger.projections import Projection, ThreadState

_GOAL_EVENTS = frozenset({GoalUpdated, GoalCleared})


class ForgettingProjection(Projection, dict=True):
    def __post_init__(self) -> None:
        self._settled: Counter[str] = Counter()
        self._goal_threads: dict[str, ThreadState] = {}  # forgotten threads that had a goal
        self._goal_statuses: dict[str, list[str]] = {}  # thread -> each status its goal changed to

    def apply_envelope(self, env: Envelope, seq: int) -> None:
        super().apply_envelope(env, seq)
        if type(env.event) in _GOAL_EVENTS:
            thread = self.threads.get(env.event.thread_id)
            goal = thread.goal if thread is not None else None
            statuses = self._goal_statuses.setdefault(env.event.thread_id, []) if goal is not None else None
            if statuses is not None and (not statuses or statuses[-1] != goal.status):
                statuses.append(goal.status)

    def forget_intent(self, intent_id: str) -> None:
        view = self.intents.pop(intent_id, None)
        self.open_ids.pop(intent_id, None)
        if view is not None:
            self._settled[view.state] += 1

    def forget_thread(self, thread_id: str) -> None:
        thread = self.threads.pop(thread_id, None)
        if thread is not None and thread.goal is not None:
            self._goal_threads[thread_id] = ThreadState(thread_id=thread_id, goal=thread.goal,
                                                        turn_triggers=thread.turn_triggers)

    def goal_statuses(self, thread_id: str) -> list[str]:
        """Each status the thread's goal changed to, in order (a report with the same
        status, as every goal turn's end brings, is no change)."""
        return self._goal_statuses.get(thread_id, [])

    def goal_threads(self) -> dict[str, ThreadState]:
        """Every thread that had a Codex goal, held or forgotten (its goal and turn
        triggers only, then), by id."""
        held = {thread_id: t for thread_id, t in self.threads.items() if t.goal is not None}
        return dict(sorted((self._goal_threads | held).items()))

    def intent_counts(self) -> dict[str, int]:
        """Intents by state: those still held and those forgotten once settled."""
        counts = Counter(self._settled)
        counts.update(view.state for view in self.intents.values())
        return dict(sorted(counts.items()))
