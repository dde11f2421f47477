"""One class, two parameter sets, two pools: each call goes to the pool of its set.

Before: a call whose full parameter set differed from its pool's was refused (exit 2), though Modal
runs each parameter set of a class in containers of its own; ``calque-run.yml`` now maps the class
to the spec files of several pools, one per set, and each call goes to the pool of its own set.
"""

import modal

app = modal.App("corpus-parameter-routing")


@app.cls()
class Translator:
    lang: str = modal.parameter(default="en")
    formal: bool = modal.parameter(default=False)

    @modal.method()
    def greet(self, name: str) -> str:
        words = {"en": ["hello", "good day"], "fr": ["salut", "bonjour"]}[self.lang]
        return f"{words[int(self.formal)]} {name}"


@app.local_entrypoint()
def main():
    plain, french = Translator(), Translator(lang="fr", formal=True)
    print(plain.greet.remote("Ada"), "|", french.greet.remote("Ada"))
    print(list(french.greet.map(["Bo", "Cy"])), list(plain.greet.map(["Di"])))


@app.local_entrypoint()
def formal_english():
    print(Translator(formal=True).greet.remote("Ed"))
