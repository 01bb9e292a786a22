"""Why a cell of the fault matrix fails today (its ``xfail``, strict: a fix makes it pass, and the marker must go; or
``flaky``, not strict: it fails some of the time): behaviour another branch lands, or a defect of the product found by
the matrix (what happens, where)."""

# Every cell passes today: a cell that fails names its reason here and takes it as ``pending`` (xfail, strict) or
# ``flaky`` (xfail, not strict) in ``faults.catalogue``.
