"""A parameterised class (modal.parameter): __init__ is never called, fields come from the pool."""

import modal

app = modal.App("params")


@app.cls()
class Greeter:
    greeting: str = modal.parameter(default="hello")
    repeat: int = modal.parameter()

    def __init__(self):
        raise RuntimeError("Modal does not call __init__ on a parameterised class")

    @modal.method()
    def greet(self, name: str) -> str:
        return " ".join([f"{self.greeting} {name}"] * self.repeat)
