"""``aadmm``: asynchronous consensus ADMM on parameter servers."""
