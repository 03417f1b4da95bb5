from sparkinfer.scheduler.errors import ContextLengthExceeded, QueueFull, RequestTooLarge


def test_error_kinds():
    assert issubclass(ContextLengthExceeded, ValueError)
    assert issubclass(RequestTooLarge, ContextLengthExceeded)
    err = QueueFull("full", retry_after_s=3.0)
    assert isinstance(err, RuntimeError) and err.retry_after_s == 3.0
