"""The GPU cost model: `oospec profile` times verify forwards on a device (table.py holds the table and
its interpolation); `oospec project` prices a bench run's acceptance traces with it. A projection,
never a measurement."""
