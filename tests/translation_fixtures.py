"""Small translation data for tests: an English–French file in the Tatoeba/Anki format."""

SUBJECTS = [("i am", "je suis"), ("you are", "tu es"), ("he is", "il est"),
            ("we are", "nous sommes"), ("they are", "ils sont"), ("she is", "elle est")]
ADJECTIVES = [("tall", "grand"), ("cold", "froid"), ("happy", "heureux"), ("tired", "fatigué"),
              ("late", "en retard"), ("ready", "prêt"), ("sick", "malade"), ("busy", "occupé")]


def write_pairs_file(path):
    """A small English–French export in the Tatoeba/Anki format, with some malformed lines."""
    lines = []
    for (en_s, fr_s) in SUBJECTS:
        for (en_a, fr_a) in ADJECTIVES:
            lines.append(f"{en_s.capitalize()} {en_a}.\t{fr_s.capitalize()} {fr_a}.\tCC-BY 2.0")
            lines.append(f"{en_s.capitalize()} not {en_a}!\t{fr_s.capitalize()} pas {fr_a}\u202f!")
    lines += ["no tab on this line", "\tempty English side", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
