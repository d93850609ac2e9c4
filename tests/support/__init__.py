"""What several test areas share: a real server process, polling, the toy pipelines and stages,
the voice demo server's arguments and speech recognition for intelligibility checks."""
