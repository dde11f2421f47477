"""Lifecycle hooks from a base class run first, in definition order."""

import modal

app = modal.App("inherit")


class Base:
    @modal.enter()
    def base_first(self):
        self.order = ["base"]


@app.cls()
class Child(Base):
    @modal.enter()
    def child_second(self):
        self.order.append("child")

    @modal.enter(snap=True)
    def snap_before_all(self):
        self.snapped = True

    @modal.method()
    def order_seen(self) -> list:
        return [self.snapped, *self.order]
