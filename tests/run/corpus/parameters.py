"""A parameterised class called with its defaults, or with the pool's values.

Before: Translator() on a pool configured {lang: fr, formal: true, max_words: 3} ran the pool's
configuration silently; only parameters passed explicitly were compared.
"""

import modal

app = modal.App("corpus-parameters")


@app.cls()
class Translator:
    lang: str = modal.parameter(default="en")
    formal: bool = modal.parameter(default=False)
    max_words: int = modal.parameter(default=5)

    @modal.method()
    def greet(self, name: str) -> str:
        words = {"en": ["hello", "good day"], "fr": ["salut", "bonjour"]}[self.lang]
        return " ".join([words[int(self.formal)], name][: self.max_words])


@app.local_entrypoint()
def main(lang: str = "", formal: bool = False, max_words: int = 0):
    given = {k: v for k, v in {"lang": lang, "formal": formal, "max_words": max_words}.items() if v}
    t = Translator(**given)
    print(t.lang, t.formal, t.max_words, "->", t.greet.remote("Ada"))
