from django.http import JsonResponse


def ingest(request):  # replaced by the real ingest view in the next commit
    return JsonResponse({"error": "not ready"}, status=503)
