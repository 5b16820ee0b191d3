"""An attached phone (opt-in): adb, the device task that pushes, runs and measures a bundle (device,
devrun, probe), and step 0, whether the NPU is likely worth it (step0)."""
