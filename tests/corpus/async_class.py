"""An async class: async @enter and async methods run on one persistent event loop."""

import asyncio

import modal

app = modal.App("async")


@app.cls()
class AsyncModel:
    @modal.enter()
    async def connect(self):
        await asyncio.sleep(0.01)
        self.loop_id = id(asyncio.get_running_loop())

    @modal.method()
    async def double(self, x: int) -> dict:
        await asyncio.sleep(0.01)
        return {"value": 2 * x, "same_loop": id(asyncio.get_running_loop()) == self.loop_id}
