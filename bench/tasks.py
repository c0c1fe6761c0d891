"""The django-q2 peer's task: does nothing (its cost is django-q2's own)."""


def noop(*args, **kwargs) -> None:
    return None
