from cupid_exp.cli import main

main()
