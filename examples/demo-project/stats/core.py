"""Mean and median of a list of numbers."""


def mean(values):
    """The arithmetic mean; raises ValueError for an empty list."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / (len(values) - 1)


def median(values):
    """The middle value (the mean of the two middle ones for an even count)."""
    if not values:
        raise ValueError("median of an empty list")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
