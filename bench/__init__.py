"""Side-by-side benchmarks of our broker, Mosquitto and amqtt (see README.md; run run.py)."""
