from dpot_data.cli import main

main()
