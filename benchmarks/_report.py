"""The report every benchmark prints as its last stdout line: floats rounded, through dicts and lists."""


def rounded(value, digits: int = 4):
    """`value` with its floats rounded to `digits` decimals, through dicts and lists (the report's JSON line)."""
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    return round(value, digits) if isinstance(value, float) else value
