from hookviz.serve.client import main

main()
