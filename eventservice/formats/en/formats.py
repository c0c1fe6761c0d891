"""Dates and times as the dashboard writes them (ISO order, 24-hour), for the admin and the
forms too: Django's English defaults ("Nov. 28, 2026, 1:05 p.m.") take a list column twice
the width and read differently from every other screen."""

DATE_FORMAT = "Y-m-d"
DATETIME_FORMAT = "Y-m-d H:i:s"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i"
TIME_FORMAT = "H:i:s"
