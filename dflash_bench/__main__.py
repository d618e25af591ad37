from dflash_bench.cli import main

main()
