from hookviz.cli import main

main()
