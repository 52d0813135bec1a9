"""`%statekit broker pause SECONDS` and `%statekit broker restart [--down S]`: the embedded broker
goes away on purpose (`statekit.broker.pause` / `restart`, the broker's lifecycle API), so that a
learner watches an app ride it out (WAITING, the band on the lag chart, the catch-up after)."""
from __future__ import annotations

from kernel_ext.lines import say
from kernel_ext.parser import Command


def run_broker(session, cmd: Command) -> None:
    """``session``: the kernel's ``commands.Session`` (its broker handle is replaced by a restart)."""
    from statekit import broker as broker_mod
    from statekit.errors import StatekitError

    session._ensure_up(spark=False)
    if session.broker is None:
        raise StatekitError("this kernel uses an external Kafka: only the embedded broker "
                            "(`%statekit up` without --bootstrap) can be paused or restarted here")
    if cmd.action == "pause":
        if cmd.down:
            raise StatekitError("--down is for `broker restart`; a pause takes SECONDS")
        seconds = 10.0 if cmd.seconds is None else cmd.seconds
        if seconds <= 0:
            raise StatekitError("a pause needs more than 0 seconds, e.g. `%statekit broker pause 10`")
        broker_mod.pause(session.broker, seconds, mid_transaction=cmd.mid_transaction)
        when = " from the next transaction's produce request on" if cmd.mid_transaction else ""
        say(f"the broker at {session.bootstrap} stops answering for {seconds:g} s{when} (connections "
            f"stay open); apps wait for it, then catch up")
        return
    if cmd.seconds is not None or cmd.mid_transaction:
        raise StatekitError("`broker restart` takes --down S, not SECONDS or --mid-transaction")
    owned = session.broker.owned
    session.broker = broker_mod.restart(session.broker, down=cmd.down)
    session.broker.owned = owned    # `down` stops it only if this kernel started the first one
    say(f"the broker at {session.bootstrap} was killed (kill -9) and started again"
        f"{f' {cmd.down:g} s later' if cmd.down else ''} on the same directory and port "
        f"(pid {session.broker.pid}); apps reconnect and replay what was in flight")
