"""What the tests, the benchmarks and the demo share that is not the engine: tiny real-architecture pairs."""
