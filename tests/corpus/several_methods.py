"""Several methods, a helper method, module-level helpers and constants, a class attribute."""

import modal

app = modal.App("tools")
SEPARATOR = "-"


def _normalise(s: str) -> str:
    return s.strip().lower()


@app.cls(timeout=60)
class Tools:
    prefix = "t"

    def _tag(self, s: str) -> str:
        return f"{self.prefix}{SEPARATOR}{s}"

    @modal.method()
    def add(self, a: int, b: int = 0) -> int:
        return a + b

    @modal.method()
    def slug(self, text: str) -> str:
        return self._tag(_normalise(text).replace(" ", SEPARATOR))
