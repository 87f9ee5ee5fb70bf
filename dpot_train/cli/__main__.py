from dpot_train.cli import main

main()
