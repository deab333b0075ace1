"""Argument checks and random generators shared by the task modules."""

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_int(name: str, value: object, *, minimum: int, why: str = "") -> None:
    """``value`` is an int ``>= minimum`` (``why`` explains the bound in the message)."""
    # bool is an int subclass; True as a batch size is surely a mistake.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        reason = f" ({why})" if why else ""
        raise ValueError(f"{name} must be an int >= {minimum}{reason}, got {value!r}")


def check_dtype(dtype: object) -> None:
    if dtype not in FLOAT_DTYPES:
        allowed = ", ".join(str(t) for t in FLOAT_DTYPES)
        raise ValueError(f"dtype must be one of {allowed}, got {dtype}")


def check_device(device: str | torch.device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"device must be a valid torch device such as 'cpu' or 'cuda:0', got {device!r}"
        ) from err


def seeded_generator(seed: int) -> torch.Generator:
    """A fresh CPU generator seeded with ``seed``."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    return torch.Generator(device="cpu").manual_seed(seed)


def resolve_generator(
    generator: torch.Generator | None, seed: int | None
) -> torch.Generator | None:
    """The generator to draw from: a fresh one for ``seed``, ``generator`` itself, or
    ``None`` (torch's global generator); at most one of the two may be given."""
    if seed is not None and generator is not None:
        raise ValueError("pass at most one of seed and generator, got both")
    if seed is not None:
        return seeded_generator(seed)
    if generator is None:
        return None
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise ValueError(
            "generator must be a CPU torch.Generator (data are drawn on the CPU, then moved "
            f"to device), got one on {generator.device}"
        )
    return generator
