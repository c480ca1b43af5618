"""Admission: one request from its key to its queue entry (:class:`Admission`)."""
