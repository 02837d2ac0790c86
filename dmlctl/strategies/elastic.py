"""Model averaging over a group that outlives a lost worker (``restart.mode:
in_place`` under local-sgd, bmuf, easgd, admm, ssgd and dpsgd).

The workers average over a gloo process group of their own, made from the run's store
(:func:`dmlctl.runtime.rejoin.store`) under a prefix per **generation**, not over the
default group: that one cannot lose a member. When a worker dies, the next collective
of the others fails (gloo reads the broken connection); each of them then makes the
next generation's group, which waits until every rank is there: the survivors and
the lost worker's replacement, forked again by its torchrun
(:mod:`dmlctl.agent.respawn`) or started on another host
(:mod:`dmlctl.agent.standin`) — or, where the run lets it go on smaller, until
``restart.rejoin_wait`` has passed: then the members are those there, numbered
afresh in the group (:mod:`dmlctl.strategies.members`). gloo tells only the dead
worker's ring neighbours (the others would wait out the whole timeout), so the first
member to see the loss marks the generation broken in the store, and every member
waits in its collectives in short slices, looking at that mark in between; the
replacement marks it too as it starts (gloo does not always tell even a neighbour).
The replacement knows its generation from the store, where every worker writes the
one it begins to form (a replacement that died while forming one is followed at the
next).

A round is one all-reduce of the flat tensors, each times a weight, and one of the
weights and the weighted step: a replacement joins with weight 0 at the round the
others retry, so the mean is the survivors' and it receives it — the model — and the
round's step from live peers, nothing from disk. The round is then complete on every
member and the world whole again (:func:`dmlctl.strategies.elastic_start.begin`).
Tensors every member holds alike (BMUF's global model and block momentum) ride along
in the same round: their mean over the members with weight 1 is their value, which
the replacement receives too.

A worker lost inside a round can leave it completed on some members (gloo's ring
delivered them every share) and not on others: those went on to their next round.
Each member keeps its latest round's result; as the next generation forms, the
members still inside that round are handed it by one that completed it, and go on
from there to meet the others at their round.
"""

from __future__ import annotations

import io
import math
import os
import socket
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore

from dmlctl.runtime import rejoin
from dmlctl.strategies import members
from dmlctl.strategies.common import assign_flat, flat_params
from dmlctl.strategies.members import MemberLost, Replaced, member_lost

if TYPE_CHECKING:
    from dmlctl.runtime.optimizer import CommMeter
    from dmlctl.strategies.elastic_start import Handover

T = TypeVar("T")

GROUP_TIMEOUT = timedelta(minutes=10)
"""How long a round waits for every member."""
FORM_TIMEOUT = timedelta(seconds=15)
"""How long a generation's members, all ready, take to connect at most (they connect
in well under a second; past this one died as it formed, or, on a machine very
busy, the generation is formed again)."""


POLL_S = 0.25
"""How often a member waiting in a collective looks whether its generation broke."""


class ElasticAverager:
    """Worker ``rank`` of ``world``'s rounds over the generations' groups (module
    docstring). :meth:`join` forms its first group."""

    def __init__(
        self, rank: int, world: int, timeout: timedelta = GROUP_TIMEOUT, wait: float = math.inf
    ) -> None:
        self.rank, self.world, self.timeout = rank, world, timeout
        #: The workers of the current generation; fewer than ``world`` once some went
        #: without a replacement for ``wait`` seconds (:mod:`dmlctl.strategies.members`).
        self.members, self.wait = tuple(range(world)), wait
        self.store = rejoin.store()
        self._mine = rejoin.key(f"elastic-generation/{rank}")
        # The newest process of this rank owns it: an older one (on a host cut off
        # and replaced elsewhere) that gets through again must not take part.
        self._owner, self._me = (
            rejoin.key(f"elastic-owner/{rank}"),
            f"{socket.gethostname()}:{os.getpid()}",
        )
        self.store.set(self._owner, self._me)
        found = rejoin.rejoining() and self.store.check([self._mine])
        self.generation = int(self.store.get(self._mine)) + 1 if found else 0
        #: A replacement holds no model until it is handed one (also when its
        #: predecessor died before it had formed a generation: then in generation 0).
        self.holding = not rejoin.rejoining()
        self.handover: Handover | None = None
        self.steps: Callable[[], int] = int  # the steps taken (int() is 0)
        self.donor: int | None = None  # the member a replacement took its state from
        self.received = 0  # bytes of that state
        self.bytes = 0  # sent in all rounds
        self.weight = 0.0  # the latest round's members that brought a model
        self.group: Any = None
        #: The latest round this member completed: its step and its result (a copy),
        #: for members a loss left inside that round (:meth:`_catch_up`).
        self._last: tuple[int, Any] | None = None
        self._given: tuple[int, Any] | None = None  # that result, handed to this member
        #: The groups of generations past, never freed: freeing a gloo group waits for
        #: its pending collective, which waits for peers that still hold theirs (a
        #: member gloo did not tell of the loss). The rank ends with ``os._exit``.
        self._retired: list[Any] = []

    def join(self, handover: Handover | None = None, steps: Callable[[], int] = int) -> None:
        """Form this worker's first generation's group (blocks until every member is
        there); a replacement is handed ``handover``'s state by a live member.
        ``steps()``: the steps this worker took (the members must agree on it)."""
        self.handover, self.steps = handover, steps
        # A replacement: its predecessor's generation is broken, whether or not gloo
        # told the members (it does not always, even a ring neighbour: seen waiting on
        # with its pair to the dead process closed).
        if not self.holding and self.generation > 0:
            self.store.set(self._broken(self.generation - 1), "1")
        self._form()

    def _form(self) -> None:
        """Form this generation's group (blocks until every rank made it) — a gloo
        process group of its own, used through its methods (not registered with
        torch.distributed's world) — and hand the members that hold no model (a
        replacement) the state (:meth:`_welcome`). A member lost meanwhile: the next
        one."""
        while True:
            self._fence()
            # The first meeting waits for everybody (a worker may prepare its data for
            # long); a later one, formed after a loss, for rejoin_wait at most.
            wait = self.wait if self.generation > 0 else math.inf
            self.members = members.agree(self.store, self.generation, self.rank, self.world, wait)
            if self.rank not in self.members:  # late: the others went on; meet them next
                self._leave()
                continue
            prefix = rejoin.key(f"elastic/{self.generation}")
            if self.group is not None:
                self._retired.append(self.group)
            place, size = self.members.index(self.rank), len(self.members)
            # Before the group forms: a replacement of this process, should it die in
            # the forming, starts at the next generation (this one cannot form).
            self.store.set(self._mine, str(self.generation))
            try:
                self._ready()
                self.group = self._connect(PrefixStore(prefix, self.store.raw), place, size)
                self._welcome()
                return
            except (RuntimeError, MemberLost) as exc:
                if not member_lost(exc):
                    raise
                self._leave()

    def _connect(self, store: PrefixStore, place: int, size: int) -> Any:
        """This generation's gloo group, its members connected within
        :data:`FORM_TIMEOUT` (every member said it was ready: only a death takes
        longer), then :attr:`timeout` for its collectives. A later generation that
        cannot connect lost a member as it formed (:class:`MemberLost`)."""
        try:
            group = dist.ProcessGroupGloo(store, place, size, FORM_TIMEOUT)
        except RuntimeError as exc:
            if self.generation == 0 or member_lost(exc):
                raise
            raise MemberLost(f"generation {self.generation} did not form: {exc}") from exc
        group._set_default_timeout(self.timeout)
        return group

    def _ready(self) -> None:
        """Wait until every member of this generation is about to form its group, in
        short slices: a member dead before it got there (its replacement marks the
        generation broken) raises :class:`MemberLost` instead of leaving the others
        blocked in the group's forming until its timeout."""
        key = f"elastic/{self.generation}/ready"
        self.store.set(rejoin.key(f"{key}/{self.rank}"), "1")
        keys = [rejoin.key(f"{key}/{r}") for r in self.members]
        while not self.store.check(keys):
            if self.store.check([self._broken(self.generation)]):
                raise MemberLost(f"generation {self.generation} broken as it formed")
            time.sleep(members.POLL_S)

    def _fence(self) -> None:
        """Raise :class:`Replaced` when a newer process runs this rank (its host was
        lost to the controller, which replaced it elsewhere)."""
        owner = self.store.get(self._owner).decode()
        if owner != self._me:
            raise Replaced(
                f"rank {self.rank} was replaced by the process {owner} while this one "
                f"({self._me}) was cut off; this one stops"
            )

    def _welcome(self) -> None:
        """Every member says whether it holds a model (:meth:`_holders`); when some
        do not, the lowest that does broadcasts :attr:`handover`'s state over the
        group (its length, then its ``torch.save`` bytes; any size) and those that
        do not load it (on the CPU: the model's own devices take it from there)."""
        holders = self._holders()
        if self.handover is not None and len(holders) < len(self.members):
            self.donor = holders[0]
            handover = self.handover
            state, size = self._send(holders[0], lambda: handover.save())
            if not self.holding:
                self.received = size
                handover.load(state)
        self.holding = True

    def _send(self, src: int, make: Callable[[], Any]) -> tuple[Any, int]:
        """Member ``src``'s ``make()`` (``torch.save``-able, any size), on every member:
        its length, then its bytes, broadcast over the group; returns it (loaded on the
        CPU, ``weights_only``) and its size in bytes."""
        blob = torch.zeros(1, dtype=torch.uint8)
        if self.rank == src:
            out = io.BytesIO()
            torch.save(make(), out)
            blob = torch.frombuffer(bytearray(out.getvalue()), dtype=torch.uint8)
        size = torch.tensor([blob.numel()], dtype=torch.int64)
        place = self.members.index(src)
        self._broadcast(size, place)
        if self.rank != src:
            blob = torch.empty(int(size[0]), dtype=torch.uint8)
        self._broadcast(blob, place)
        data = io.BytesIO(blob.numpy().tobytes())
        return torch.load(data, map_location="cpu", weights_only=True), blob.numel()

    def _broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """``tensor`` ← member ``src``'s, in place (one gloo broadcast)."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self._wait(self.group.broadcast([tensor], opts))

    def _holders(self) -> list[int]:
        """The members that hold a model, those at the newest step first (one
        all-reduce of a flag, the step count and the latest completed round's step
        of each). Members a loss left inside a round that the others completed are
        handed its result (:meth:`_catch_up`). Raises when none holds a model (all
        were lost), or when the steps differ otherwise (the run restarts)."""
        said = torch.zeros(3, len(self.members), dtype=torch.float64)
        me, last = self.members.index(self.rank), self._last[0] if self._last else -1
        said[:, me] = torch.tensor([1.0, self.steps(), last]) if self.holding else 0.0
        self._wait(self.group.allreduce([said]))
        places = [i for i in range(len(self.members)) if said[0, i] > 0]
        steps = {self.members[i]: (int(said[1, i]), int(said[2, i])) for i in places}
        if not steps:
            if not self.holding:  # a replacement: the others may have ended the run
                members.end_if_run_over(self.store, self.rank, self.world)
            raise members.InPlaceLost(self.generation, "no worker holds the model (all were lost)")
        newest = max(step for step, _ in steps.values())
        ahead = [r for r, (step, _) in steps.items() if step == newest]
        behind = [r for r, (step, _) in steps.items() if step < newest]
        done = {steps[r][1] for r in ahead}
        if behind and (len(done) > 1 or any(steps[r][0] not in done for r in behind)):
            at = ", ".join(f"rank {r}: {n}" for r, (n, _) in steps.items())
            raise members.InPlaceLost(
                self.generation,
                f"the workers are at different steps ({at}): a worker was lost inside a "
                "round that only some of them had completed, and not the latest one they did",
            )
        if behind:
            self._catch_up(ahead[0], behind)
        return [*ahead, *behind]

    def _catch_up(self, src: int, behind: list[int]) -> None:
        """Members ``behind`` are inside the round that the others completed last (a
        worker was lost after some got its result): member ``src`` hands them that
        result, which their round returns instead of running again (:meth:`rounds`)."""
        given, _ = self._send(src, lambda: self._last)
        if self.rank in behind:
            self._given = given

    def average(
        self,
        tensors: Sequence[torch.Tensor],
        step: int,
        meter: CommMeter,
        *,
        joining: bool = False,
        wire: torch.dtype | None = None,
    ) -> tuple[torch.Tensor, int]:
        """Every member's ``tensors`` ← their mean over the members that bring a
        model (a replacement ``joining`` brings none), in place; returns the mean and
        the round's step (the others' ``step`` for a replacement). A member lost in
        the round: the next generation is formed and the round done again there.
        ``meter`` counts the round's bytes and time and shows the generation. ``wire``:
        the dtype sent (fp16/bf16 compression; each share is divided by the world
        size first, so the sum cannot overflow)."""
        began = time.perf_counter()
        weight = 0.0 if joining else 1.0

        def round_() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            flat = flat_params(tensors)
            flat.mul_(weight if wire is None else weight / len(self.members))
            sent = flat if wire is None else flat.to(wire)
            meta = torch.tensor([weight, weight * step], dtype=torch.float64)
            self.allreduce(sent)
            self.allreduce(meta)
            return flat, sent, meta

        flat, sent, meta = self.rounds(round_, step)
        if meta[0] <= 0:
            raise RuntimeError("an averaging round with no member bringing a model")
        self.weight = float(meta[0])
        if wire is None:
            flat /= self.weight
        else:
            flat = sent.to(flat.dtype).mul_(len(self.members) / self.weight)
        assign_flat(list(tensors), flat)
        nbytes = sent.numel() * sent.element_size()
        self.bytes += nbytes
        meter.add(nbytes, time.perf_counter() - began)
        meter.extra["generation"] = self.generation
        return flat, round(float(meta[1] / meta[0]))

    def rounds(self, body: Callable[[], T], step: int | None = None) -> T:
        """``body()`` (collectives over :attr:`group`); a member lost in it: the next
        generation is formed (with the replacement) and ``body()`` runs again there —
        unless the others had completed it (the round of ``step``): then what it gave
        them (a tensor or a tuple of them; kept as the latest round's)."""
        while True:
            given, self._given = self._given, None
            if given is not None and step is not None and given[0] == step:
                out: T = given[1]
            else:
                try:
                    out = body()
                except (RuntimeError, MemberLost) as exc:
                    if not member_lost(exc):
                        raise
                    self._next_generation()
                    continue
            if step is not None:
                self._last = (step, _copy(out))
            return out

    def allreduce(self, tensor: torch.Tensor) -> None:
        """``tensor`` ← its sum over the members, in place (one gloo all-reduce)."""
        self._wait(self.group.allreduce([tensor]))

    def exchange(self, sent: Sequence[torch.Tensor], sizes: Sequence[int]) -> list[torch.Tensor]:
        """Send ``sent[j]`` (1-D, one dtype and device; may be empty) to each member ``j`` and
        return what each sent this one (``sizes[j]`` elements from ``j``): one gloo
        all-to-all, so that a member waits in it as in any collective."""
        out = torch.empty(sum(sizes), dtype=sent[0].dtype, device=sent[0].device)
        splits = [t.numel() for t in sent]
        work = self.group.alltoall_base(
            out, torch.cat(list(sent)), list(sizes), splits, dist.AllToAllOptions()
        )
        self._wait(work)
        return list(torch.split(out, list(sizes)))

    def _wait(self, work: Any) -> None:
        """Wait for ``work``, looking every :data:`POLL_S` seconds whether another
        member has found this generation broken: a member whose ring neighbours
        died is not told by gloo (it would wait out the whole timeout). Raises
        :class:`MemberLost` then; what the collective raised otherwise."""
        while True:
            try:
                work.wait(timedelta(seconds=POLL_S))
                return
            except RuntimeError as exc:
                if "Operation timed out" not in str(exc):  # not the poll's own timeout
                    raise
                if self.store.check([self._broken(self.generation)]):
                    raise MemberLost(f"generation {self.generation} broken") from exc

    def _broken(self, generation: int) -> str:
        return rejoin.key(f"elastic/{generation}/broken")

    def _next_generation(self) -> None:
        """A member was lost: mark this generation broken (for the members gloo does
        not tell), then form the next one's group (with the replacement)."""
        self._leave()
        self._form()

    def _leave(self) -> None:
        """This generation lost a member: marked broken in the store (for the
        members gloo does not tell); the next one is this worker's."""
        self.store.set(self._broken(self.generation), "1")
        self.generation += 1

    def broadcast(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """Every member's ``tensors`` ← member ``src``'s, as they are (any dtype, no
        arithmetic), in place. A member lost meanwhile is not recovered from: this
        raises (the run then restarts as a whole)."""
        for tensor in tensors:
            self._broadcast(tensor, src)


def _copy(out: Any) -> Any:
    """A copy of a round's result (a tensor, or a tuple of them), to hand on."""
    if isinstance(out, tuple):
        return tuple(_copy(x) for x in out)
    return out.clone() if isinstance(out, torch.Tensor) else out
