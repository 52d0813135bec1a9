"""Log cleaner (placeholder while the broker basics come up)."""
from __future__ import annotations

import asyncio


class LogCleaner:
    def __init__(self, broker):
        self.broker = broker
        self.done_token = None

    def wake(self):
        pass

    async def run(self):
        while True:
            await asyncio.sleep(1)

    async def close(self):
        pass
