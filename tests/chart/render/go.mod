module kipam.dev/chart-render

go 1.22
