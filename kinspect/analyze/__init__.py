"""kinspect analyze: a PySpark job that turns capture files into tables and an HTML report."""
